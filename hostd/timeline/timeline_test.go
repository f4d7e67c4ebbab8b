package timeline

import "testing"

func TestWordingMatchesProductPage(t *testing.T) {
	tests := []struct{ got, want string }{
		{Reserved(40000), "Budget $0.04 reserved"},
		{WorkerStarted(true, false), "worker started · shell on · web off"},
		{WorkerStarted(false, true), "worker started · shell off · web on"},
		{WorkerStarted(true, false, "example-crm"), "worker started · shell on · web off · connections example-crm"},
		{WorkerStarted(true, true, "crm", "billing"), "worker started · shell on · web on · connections crm, billing"},
		{EgressBlocked(1, 0, 2), "egress blocked: 3 packets (DNS 1, IPv6 0, other 2)"},
		{EgressBlocked(0, 1, 0), "egress blocked: 1 packet (DNS 0, IPv6 1, other 0)"},
		{Command("pwd; whoami"), "$ pwd; whoami"},
		{ModelSummary(3, 5214), "3 model calls, 5,214 tokens"},
		{ModelSummary(1, 1), "1 model call, 1 token"},
		{ModelSummary(0, 0), "0 model calls, 0 tokens"},
		{Settled(3530, 36470), "$0.00353 charged, $0.03647 released"},
		{RecordingCapped(13, 8<<20), "recording cap of 8 MiB reached: turn 13 and later turns are not recorded"},
		{TimelineCapped(12, 1, 1363149, 4<<20), "timeline cap of 4 MiB reached: 12 entries not stored, 1 cut short (1.3 MiB)"},
		{TimelineCapped(1, 0, 2560, 4<<20), "timeline cap of 4 MiB reached: 1 entry not stored (2.5 KiB)"},
		{TimelineCapped(0, 2, 900, 1000), "timeline cap of 1,000 bytes reached: 2 cut short (900 bytes)"},
		{OutputKept("report.md", 1229), "kept report.md (1.2 KiB)"},
		{OutputSkipped("out/big.csv", OverFileCap(12<<20, 10<<20)), "skipped out/big.csv: 12 MiB over the 10 MiB per-file cap"},
		{OverRunCap(5<<20, 50<<20), "5 MiB would take the run's outputs past their 50 MiB cap"},
		{GrewPastCap(10 << 20), "grew while being copied, past the 10 MiB it could take"},
		{OutputUnmatched("out/*.csv"), "nothing matches out/*.csv"},
		{OutputsTruncated(1000), "more than 1,000 entries match the output patterns; the rest are skipped"},
		{WebhookDelivered(204, 1), "webhook delivered: 204 after 1 attempt"},
		{WebhookFailed(6, "503"), "webhook failed after 6 attempts (last: 503)"},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("got %q, want %q", tt.got, tt.want)
		}
	}
}

func TestHubWakesWaitersOnce(t *testing.T) {
	h := NewHub()
	a := h.Changed("run_a")
	b := h.Changed("run_b")
	h.Notify("run_a")
	select {
	case <-a:
	default:
		t.Fatal("waiter on run_a not woken")
	}
	select {
	case <-b:
		t.Fatal("waiter on run_b woken by run_a's change")
	default:
	}
	if next := h.Changed("run_a"); next == a {
		t.Fatal("Changed after Notify returned the already closed channel")
	}
}
