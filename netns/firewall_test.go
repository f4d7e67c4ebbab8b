package netns

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// packet is what the rule evaluator below looks at.
type packet struct {
	nfproto, l4proto byte
	iif, oif         string
	src, dst         netip.Addr
	sport, dport     uint16
	ct               uint32 // conntrack state bits
}

// verdict is the outcome of a packet's trip through one chain.
type verdict struct {
	kind    expr.VerdictKind
	comment string // of the deciding rule; "policy" when none decided
	counted bool   // a counter in the deciding rule saw the packet
}

// evaluate runs p through the chain as the kernel would, for the subset of
// nftables expressions the rule builder uses; anything else fails the test,
// so a new expression cannot slip past these tests unexamined.
func evaluate(t *testing.T, specs []ruleSpec, chain string, p packet) verdict {
	t.Helper()
	for _, r := range specs {
		if r.chain != chain {
			continue
		}
		if v, decided := evalRule(t, r, p); decided {
			return v
		}
	}
	return verdict{kind: expr.VerdictDrop, comment: "policy"}
}

func evalRule(t *testing.T, r ruleSpec, p packet) (verdict, bool) {
	t.Helper()
	regs := map[uint32][]byte{}
	counted := false
	for _, e := range r.exprs {
		switch e := e.(type) {
		case *expr.Meta:
			switch e.Key {
			case expr.MetaKeyNFPROTO:
				regs[e.Register] = []byte{p.nfproto}
			case expr.MetaKeyL4PROTO:
				regs[e.Register] = []byte{p.l4proto}
			case expr.MetaKeyIIFNAME:
				regs[e.Register] = ifname(p.iif)
			case expr.MetaKeyOIFNAME:
				regs[e.Register] = ifname(p.oif)
			default:
				t.Fatalf("rule %q: meta key %v not modelled", r.comment, e.Key)
			}
		case *expr.Payload:
			var hdr []byte
			switch e.Base {
			case expr.PayloadBaseNetworkHeader:
				hdr = networkHeader(p)
			case expr.PayloadBaseTransportHeader:
				hdr = binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint16(nil, p.sport), p.dport)
			default:
				t.Fatalf("rule %q: payload base %v not modelled", r.comment, e.Base)
			}
			if int(e.Offset+e.Len) > len(hdr) {
				t.Fatalf("rule %q: payload load past header end", r.comment)
			}
			regs[e.DestRegister] = hdr[e.Offset : e.Offset+e.Len]
		case *expr.Ct:
			if e.Key != expr.CtKeySTATE {
				t.Fatalf("rule %q: ct key %v not modelled", r.comment, e.Key)
			}
			regs[e.Register] = binaryutil.NativeEndian.PutUint32(p.ct)
		case *expr.Bitwise:
			src := regs[e.SourceRegister]
			if len(src) != int(e.Len) || len(e.Mask) != int(e.Len) || len(e.Xor) != int(e.Len) {
				t.Fatalf("rule %q: bitwise length mismatch", r.comment)
			}
			out := make([]byte, e.Len)
			for i := range out {
				out[i] = src[i]&e.Mask[i] ^ e.Xor[i]
			}
			regs[e.DestRegister] = out
		case *expr.Cmp:
			reg, ok := regs[e.Register]
			if !ok || len(reg) != len(e.Data) {
				t.Fatalf("rule %q: cmp of %d bytes against register holding %d", r.comment, len(e.Data), len(reg))
			}
			equal := bytes.Equal(reg, e.Data)
			switch e.Op {
			case expr.CmpOpEq:
				if !equal {
					return verdict{}, false
				}
			case expr.CmpOpNeq:
				if equal {
					return verdict{}, false
				}
			default:
				t.Fatalf("rule %q: cmp op %v not modelled", r.comment, e.Op)
			}
		case *expr.Counter:
			counted = true
		case *expr.Verdict:
			return verdict{kind: e.Kind, comment: r.comment, counted: counted}, true
		default:
			t.Fatalf("rule %q: expression %T not modelled", r.comment, e)
		}
	}
	return verdict{}, false
}

func ifname(name string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return b
}

// networkHeader lays the addresses out where IPv4 or IPv6 keeps them.
func networkHeader(p packet) []byte {
	if p.nfproto == unix.NFPROTO_IPV6 {
		h := make([]byte, 40)
		copy(h[8:], p.src.AsSlice())
		copy(h[24:], p.dst.AsSlice())
		return h
	}
	h := make([]byte, 20)
	copy(h[12:], p.src.AsSlice())
	copy(h[16:], p.dst.AsSlice())
	return h
}

var (
	testHost  = netip.MustParseAddr("10.99.0.2")
	guestV6   = netip.MustParseAddr("fe80::2")
	gatewayV6 = netip.MustParseAddr("fe80::1")
)

func fromGuest(l4 byte, dst netip.Addr, dport uint16) packet {
	return packet{nfproto: unix.NFPROTO_IPV4, l4proto: l4, iif: TapName, src: GuestAddr, dst: dst, sport: 40000, dport: dport, ct: expr.CtStateBitNEW}
}

func TestRulesDecidePackets(t *testing.T) {
	const port = 3128
	broker := Config{Mode: Broker, BrokerPort: port}
	sealed := Config{Mode: Sealed}
	accept, drop := expr.VerdictAccept, expr.VerdictDrop

	spoofed := fromGuest(unix.IPPROTO_TCP, GatewayAddr, port)
	spoofed.src = netip.MustParseAddr("10.77.0.3")
	viaLoopback := fromGuest(unix.IPPROTO_TCP, GatewayAddr, port)
	viaLoopback.iif = "lo"
	v6 := fromGuest(unix.IPPROTO_TCP, gatewayV6, port)
	v6.nfproto, v6.src = unix.NFPROTO_IPV6, guestV6
	reply := packet{nfproto: unix.NFPROTO_IPV4, l4proto: unix.IPPROTO_TCP, oif: TapName, src: GatewayAddr, dst: GuestAddr,
		sport: port, dport: 40000, ct: expr.CtStateBitESTABLISHED}
	newToGuest := reply
	newToGuest.ct = expr.CtStateBitNEW
	replyOtherPort := reply
	replyOtherPort.sport = port + 1

	tests := []struct {
		name     string
		cfg      Config
		chain    string
		p        packet
		want     expr.VerdictKind
		category category
	}{
		{"sealed: guest to gateway broker port", sealed, "input", fromGuest(unix.IPPROTO_TCP, GatewayAddr, port), drop, categoryOther},
		{"sealed: guest DNS over udp", sealed, "input", fromGuest(unix.IPPROTO_UDP, GatewayAddr, 53), drop, categoryDNS},
		{"sealed: guest DNS over tcp", sealed, "input", fromGuest(unix.IPPROTO_TCP, GatewayAddr, 53), drop, categoryDNS},
		{"sealed: guest to routed host", sealed, "forward", fromGuest(unix.IPPROTO_TCP, testHost, 443), drop, categoryOther},
		{"sealed: guest DNS to routed host", sealed, "forward", fromGuest(unix.IPPROTO_UDP, testHost, 53), drop, categoryDNS},
		{"sealed: guest IPv6", sealed, "input", v6, drop, categoryIPv6},
		{"sealed: reply to guest", sealed, "output", reply, drop, categoryOther},
		{"broker: guest to broker", broker, "input", fromGuest(unix.IPPROTO_TCP, GatewayAddr, port), accept, categoryBroker},
		{"broker: broker replies", broker, "output", reply, accept, categoryBroker},
		{"broker: new connection to guest", broker, "output", newToGuest, drop, categoryOther},
		{"broker: reply from another port", broker, "output", replyOtherPort, drop, categoryOther},
		{"broker: guest to other gateway port", broker, "input", fromGuest(unix.IPPROTO_TCP, GatewayAddr, port+1), drop, categoryOther},
		{"broker: guest udp to broker port", broker, "input", fromGuest(unix.IPPROTO_UDP, GatewayAddr, port), drop, categoryOther},
		{"broker: spoofed guest source", broker, "input", spoofed, drop, categoryOther},
		{"broker: not from the tap", broker, "input", viaLoopback, drop, categoryOther},
		{"broker: guest to routed host on broker port", broker, "forward", fromGuest(unix.IPPROTO_TCP, testHost, port), drop, categoryOther},
		{"broker: guest DNS", broker, "input", fromGuest(unix.IPPROTO_UDP, GatewayAddr, 53), drop, categoryDNS},
		{"broker: guest IPv6 to broker port", broker, "input", v6, drop, categoryIPv6},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := evaluate(t, rules(tt.cfg), tt.chain, tt.p)
			if got.kind != tt.want {
				t.Fatalf("verdict %v by %q, want %v", got.kind, got.comment, tt.want)
			}
			if categoryOf(got.comment) != tt.category {
				t.Errorf("decided by %q, want a %s rule", got.comment, tt.category)
			}
			if tt.want == drop && !got.counted {
				t.Errorf("drop by %q is not counted", got.comment)
			}
		})
	}
}

func TestRulesShape(t *testing.T) {
	for _, cfg := range []Config{{Mode: Sealed}, {Mode: Broker, BrokerPort: 8080}} {
		t.Run(cfg.Mode.String(), func(t *testing.T) {
			specs := rules(cfg)
			seen := map[string]bool{}
			for _, r := range specs {
				key := installedRule{chain: r.chain, comment: r.comment}.key()
				if seen[key] {
					// Counters are carried over by chain and comment.
					t.Errorf("duplicate rule %q in %s", r.comment, r.chain)
				}
				seen[key] = true
			}
			for _, c := range baseChains {
				var last ruleSpec
				for _, r := range specs {
					if r.chain == c.name {
						last = r
					}
				}
				if categoryOf(last.comment) != categoryOther {
					t.Errorf("chain %s ends with %q, want the counted catch-all", c.name, last.comment)
				}
			}
		})
	}
}

func TestRulesSealedAcceptsNothing(t *testing.T) {
	for _, r := range rules(Config{Mode: Sealed}) {
		for _, e := range r.exprs {
			if v, ok := e.(*expr.Verdict); ok && v.Kind != expr.VerdictDrop {
				t.Errorf("sealed rule %q in %s has verdict %v", r.comment, r.chain, v.Kind)
			}
		}
	}
}

func TestUpToDate(t *testing.T) {
	installedFor := func(cfg Config) []installedRule {
		var out []installedRule
		for _, r := range rules(cfg) {
			out = append(out, installedRule{chain: r.chain, comment: r.comment})
		}
		return out
	}
	b8080 := Config{Mode: Broker, BrokerPort: 8080}
	tests := []struct {
		name      string
		installed []installedRule
		chainsOK  bool
		want      Config
		upToDate  bool
	}{
		{"same config", installedFor(b8080), true, b8080, true},
		{"nothing installed", nil, false, b8080, false},
		{"other port", installedFor(Config{Mode: Broker, BrokerPort: 8081}), true, b8080, false},
		{"other mode", installedFor(Config{Mode: Sealed}), true, b8080, false},
		{"chain policy changed", installedFor(b8080), false, b8080, false},
		{"rule removed", installedFor(b8080)[1:], true, b8080, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := upToDate(tt.installed, tt.chainsOK, rules(tt.want)); got != tt.upToDate {
				t.Errorf("upToDate = %v, want %v", got, tt.upToDate)
			}
		})
	}
}

func TestSumCounters(t *testing.T) {
	installed := []installedRule{
		{chain: "input", comment: "ipv6: every IPv6 packet", counter: &expr.Counter{Packets: 1, Bytes: 80}},
		{chain: "input", comment: "dns: udp port 53", counter: &expr.Counter{Packets: 2, Bytes: 120}},
		{chain: "forward", comment: "dns: tcp port 53", counter: &expr.Counter{Packets: 3, Bytes: 180}},
		{chain: "input", comment: "broker: tcp 10.77.0.2 -> 10.77.0.1:3128"},
		{chain: "input", comment: "other: everything else", counter: &expr.Counter{Packets: 4, Bytes: 240}},
		{chain: "output", comment: "other: everything else", counter: &expr.Counter{Packets: 5, Bytes: 300}},
	}
	got, err := sumCounters(installed)
	if err != nil {
		t.Fatal(err)
	}
	want := Counters{IPv6: Counter{1, 80}, DNS: Counter{5, 300}, Other: Counter{9, 540}}
	if got != want {
		t.Errorf("sumCounters = %+v, want %+v", got, want)
	}
	if total := got.Total(); total != (Counter{15, 920}) {
		t.Errorf("Total = %+v, want {15 920}", total)
	}

	stranger := append(installed, installedRule{chain: "input", comment: "added by hand", counter: &expr.Counter{}})
	if _, err := sumCounters(stranger); err == nil {
		t.Error("sumCounters accepted a counted rule it does not know")
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		cfg Config
		ok  bool
	}{
		{Config{Mode: Sealed}, true},
		{Config{Mode: Broker, BrokerPort: 3128}, true},
		{Config{Mode: Sealed, BrokerPort: 3128}, false},
		{Config{Mode: Broker}, false},
		{Config{Mode: Broker, BrokerPort: 53}, false},
		{Config{Mode: Mode(7)}, false},
	}
	for _, tt := range tests {
		if err := tt.cfg.Validate(); (err == nil) != tt.ok {
			t.Errorf("%+v: Validate() = %v, want ok=%v", tt.cfg, err, tt.ok)
		}
	}
}
