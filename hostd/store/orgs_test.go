package store

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// A second organisation or member of the same name is ErrExists, and
// nothing of it is stored.
func TestDuplicateNamesAreErrExists(t *testing.T) {
	ctx := context.Background()
	st := openTestStore(t)
	org, err := st.CreateOrg(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreateOrg(ctx, "acme"); !errors.Is(err, ErrExists) {
		t.Errorf("second acme: %v, want ErrExists", err)
	}
	if _, err := st.AddMember(ctx, org.ID, "dev@acme.example"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.AddMember(ctx, org.ID, "dev@acme.example"); !errors.Is(err, ErrExists) {
		t.Errorf("second member: %v, want ErrExists", err)
	}
	other, err := st.CreateOrg(ctx, "globex")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.AddMember(ctx, other.ID, "dev@acme.example"); err != nil {
		t.Errorf("the same email in another organisation: %v", err)
	}
	orgs, _, err := st.OrgsPage(ctx, "", 10)
	if err != nil || len(orgs) != 2 {
		t.Errorf("organisations %v, %v", orgs, err)
	}
	members, err := st.Members(ctx, org.ID)
	if err != nil || len(members) != 1 {
		t.Errorf("members of acme %v, %v", members, err)
	}
}

// Organisations come in name order a page at a time.
func TestOrgsPage(t *testing.T) {
	ctx := context.Background()
	st := openTestStore(t)
	for _, name := range []string{"delta", "alpha", "echo", "charlie", "bravo"} {
		if _, err := st.CreateOrg(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	var pages []string
	after := ""
	for {
		orgs, more, err := st.OrgsPage(ctx, after, 2)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, o := range orgs {
			names = append(names, o.Name)
		}
		pages = append(pages, fmt.Sprint(names))
		if !more {
			break
		}
		after = orgs[len(orgs)-1].Name
	}
	if got := fmt.Sprint(pages); got != "[[alpha bravo] [charlie delta] [echo]]" {
		t.Errorf("pages %s", got)
	}
}

// Keys lists an organisation's keys, newest first, with their member, when
// each was last used and whether it was revoked; never another's keys.
func TestKeysListsUseAndRevocation(t *testing.T) {
	ctx := context.Background()
	st := openTestStore(t)
	org, _ := st.CreateOrg(ctx, "acme")
	dev, _ := st.AddMember(ctx, org.ID, "dev@acme.example")
	ops, _ := st.AddMember(ctx, org.ID, "ops@acme.example")
	other, _ := st.CreateOrg(ctx, "globex")
	outsider, _ := st.AddMember(ctx, other.ID, "dev@globex.example")
	for _, k := range []struct {
		m  Member
		id string
	}{{dev, "k_old"}, {ops, "k_ops"}, {outsider, "k_globex"}} {
		if err := st.AddKey(ctx, k.m, k.id, []byte("hash")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond) // created_at is in milliseconds: keep the order unambiguous
	}
	used := time.Now().UTC().Truncate(time.Millisecond)
	if err := st.TouchKey(ctx, "k_ops", used.Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := st.TouchKey(ctx, "k_ops", used); err != nil {
		t.Fatal(err)
	}
	if err := st.RevokeKey(ctx, "k_old"); err != nil {
		t.Fatal(err)
	}
	keys, err := st.Keys(ctx, org.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 || keys[0].ID != "k_ops" || keys[1].ID != "k_old" {
		t.Fatalf("keys %+v", keys)
	}
	if k := keys[0]; k.MemberEmail != "ops@acme.example" || k.LastUsedAt == nil || !k.LastUsedAt.Equal(used) || k.RevokedAt != nil {
		t.Errorf("used key %+v", k)
	}
	if k := keys[1]; k.MemberEmail != "dev@acme.example" || k.LastUsedAt != nil || k.RevokedAt == nil {
		t.Errorf("revoked key %+v", k)
	}
	if k, err := st.KeyByID(ctx, "k_ops"); err != nil || k.LastUsedAt == nil || !k.LastUsedAt.Equal(used) {
		t.Errorf("KeyByID: %+v %v", k, err)
	}
}
