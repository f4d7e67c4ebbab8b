package sandbox

import (
	"regexp"
	"testing"
)

// Every provision is valid as the guest checks it, and no two share
// anything a guest could tell clones apart by.
func TestNewProvisionIsValidAndUnique(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		p := NewProvision()
		if err := p.Validate(); err != nil {
			t.Fatalf("NewProvision() = %+v: %v", p, err)
		}
		if !regexp.MustCompile(`^[A-Za-z0-9]{6}$`).MatchString(p.ScratchName) {
			t.Errorf("scratch name %q: want 6 letters and digits", p.ScratchName)
		}
		if p.MachineID[12] != '4' {
			t.Errorf("machine id %s is not a version 4 UUID", p.MachineID)
		}
		for _, v := range []string{"entropy " + string(p.Entropy), "machine id " + p.MachineID, "hostname " + p.Hostname, "scratch " + p.ScratchName} {
			if seen[v] {
				t.Errorf("two provisions share %q", v)
			}
			seen[v] = true
		}
	}
}
