package worker

import (
	"reflect"
	"strings"
	"testing"
)

const samplePasswd = `root:x:0:0:root:/root:/bin/bash
daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin
worker:x:1000:1000:Ephemeral worker:/home/worker:/bin/bash
`

const sampleGroup = `root:x:0:
adm:x:4:syslog,worker
worker:x:1000:
users:x:100:alice,worker
broken
`

func TestParseAccount(t *testing.T) {
	got, err := parseAccount(strings.NewReader(samplePasswd), strings.NewReader(sampleGroup), "worker")
	if err != nil {
		t.Fatal(err)
	}
	want := Account{Name: "worker", UID: 1000, GID: 1000, Groups: []uint32{4, 100}, Home: "/home/worker"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if _, err := parseAccount(strings.NewReader(samplePasswd), strings.NewReader(sampleGroup), "nobody"); err == nil {
		t.Error("unknown user: no error")
	}
	if _, err := parseAccount(strings.NewReader("worker:x:abc:1000::/:/bin/sh\n"), strings.NewReader(""), "worker"); err == nil {
		t.Error("malformed uid: no error")
	}
}

func FuzzParseAccount(f *testing.F) {
	f.Add(samplePasswd, sampleGroup, "worker")
	f.Add("worker:x:1000:1000:::\n", "g:x:5:worker\n", "worker")
	f.Fuzz(func(t *testing.T, passwd, group, name string) {
		acct, err := parseAccount(strings.NewReader(passwd), strings.NewReader(group), name)
		if err == nil && acct.Name != name {
			t.Errorf("found %q when asked for %q", acct.Name, name)
		}
	})
}

func TestBuildEnv(t *testing.T) {
	acct := Account{Name: "worker", Home: "/home/worker"}
	got := buildEnv(acct, []string{"FOO=1", "PATH=/opt/bin", "noequals", "=empty", "FOO=2", "NUL=a\x00b"})
	want := []string{
		"PATH=/opt/bin", "HOME=/home/worker", "USER=worker", "LOGNAME=worker", "LANG=C.UTF-8", "FOO=2",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("buildEnv = %q, want %q", got, want)
	}
	if p := envPath(got); p != "/opt/bin" {
		t.Errorf("envPath = %q", p)
	}
}
