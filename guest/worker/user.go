package worker

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// Account is a user of the guest image as /etc/passwd and /etc/group
// describe it. The init is static (no NSS), so it reads the files itself.
type Account struct {
	Name   string
	UID    uint32
	GID    uint32
	Groups []uint32 // supplementary groups
	Home   string
}

// LookupAccount reads name's entry from the image's account files under
// root ("/" in the guest).
func LookupAccount(root, name string) (Account, error) {
	passwd, err := os.Open(root + "/etc/passwd")
	if err != nil {
		return Account{}, fmt.Errorf("worker: lookup user %s: %w", name, err)
	}
	defer passwd.Close()
	group, err := os.Open(root + "/etc/group")
	if err != nil {
		return Account{}, fmt.Errorf("worker: lookup user %s: %w", name, err)
	}
	defer group.Close()
	return parseAccount(passwd, group, name)
}

func parseAccount(passwd, group io.Reader, name string) (Account, error) {
	acct, found := Account{Name: name}, false
	sc := bufio.NewScanner(passwd)
	for sc.Scan() {
		f := strings.Split(sc.Text(), ":")
		if len(f) < 7 || f[0] != name {
			continue
		}
		uid, err1 := strconv.ParseUint(f[2], 10, 32)
		gid, err2 := strconv.ParseUint(f[3], 10, 32)
		if err1 != nil || err2 != nil {
			return Account{}, fmt.Errorf("worker: lookup user %s: malformed passwd entry", name)
		}
		acct.UID, acct.GID, acct.Home, found = uint32(uid), uint32(gid), f[5], true
		break
	}
	if err := sc.Err(); err != nil {
		return Account{}, fmt.Errorf("worker: lookup user %s: read passwd: %w", name, err)
	}
	if !found {
		return Account{}, fmt.Errorf("worker: lookup user %s: no such user", name)
	}
	sc = bufio.NewScanner(group)
	for sc.Scan() {
		f := strings.Split(sc.Text(), ":")
		if len(f) < 4 {
			continue
		}
		gid, err := strconv.ParseUint(f[2], 10, 32)
		if err != nil || uint32(gid) == acct.GID {
			continue
		}
		for _, member := range strings.Split(f[3], ",") {
			if member == name {
				acct.Groups = append(acct.Groups, uint32(gid))
			}
		}
	}
	if err := sc.Err(); err != nil {
		return Account{}, fmt.Errorf("worker: lookup user %s: read group: %w", name, err)
	}
	return acct, nil
}
