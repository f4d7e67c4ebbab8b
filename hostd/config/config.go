// Package config is the one table of everything Ephemeral's daemon and CLI
// read: each setting has a command-line flag, an EPHEMERAL_* environment
// variable and a key in the JSON configuration file, and one rule decides
// between them: flag > environment > file > default.
//
// The package reads no environment and no files by itself: Load is handed
// the command line's values, a getenv and a readFile, so it can be tested
// and so libraries further down never look around for settings. The
// composition root (package system) turns a Config into the daemon.
package config

import (
	"encoding/hex"
	"fmt"
	"net"
	"runtime"
	"strings"
	"time"

	"github.com/ephemeralhq/ephemeral/guest/limits"
	"github.com/ephemeralhq/ephemeral/vmm"
)

// Config is every setting, typed. Defaults returns its default values.
type Config struct {
	StateDir string
	// Database is empty for the embedded SQLite database in StateDir, or
	// a postgres:// URL of a database that several daemons share.
	Database string
	// NodeLease is how long a daemon sharing a PostgreSQL database may
	// miss its heartbeats before another marks its runs node_lost.
	NodeLease time.Duration
	Listen    string
	// TrustedProxies lists the load balancers (addresses, CIDR prefixes,
	// comma-separated) whose X-Forwarded-For and X-Forwarded-Proto are
	// believed.
	TrustedProxies string
	// MetricsListen is where /metrics is served; empty: nowhere.
	MetricsListen string
	// VMM is "auto", "qemu" or "cloud-hypervisor".
	VMM string

	Retention       time.Duration
	JanitorInterval time.Duration
	ShutdownTimeout time.Duration

	MaxConcurrentRuns   int
	MaxActiveRunsPerOrg int

	// Abuse limits of the API, per API key and per client address: run
	// creations and other requests per second (in bursts of twice as
	// many), event streams open at once.
	LimitKeyRunCreations     int
	LimitKeyReads            int
	LimitKeyStreams          int
	LimitAddressRunCreations int
	LimitAddressReads        int
	LimitAddressStreams      int
	// PoolSize is how many ready sandboxes the daemon keeps for runs; 0
	// keeps none.
	PoolSize       int
	MaxCostMicros  int64
	MaxModelTurns  int
	CommandTimeout time.Duration
	// BootTimeout bounds a run's boot; the run's own timeout starts when
	// its microVM is ready.
	BootTimeout time.Duration
	// MaxRecordingBytes and MaxTimelineBytes cap what one run stores of
	// its model turns and of its timeline's content.
	MaxRecordingBytes int64
	MaxTimelineBytes  int64
	// MaxOutputFileBytes and MaxOutputBytes cap each output file a run
	// keeps and all of them together.
	MaxOutputFileBytes int64
	MaxOutputBytes     int64

	// Webhook deliveries: how many attempts, the first wait (each later
	// one three times longer) and the limit of one attempt.
	WebhookAttempts   int
	WebhookFirstRetry time.Duration
	WebhookTimeout    time.Duration

	DefaultModel             string
	ComputeMicrosPerVMSecond int64
	WebMicrosPerRequest      int64

	OpenAIBaseURL        string
	OpenAIAPIKey         string
	OpenAIMaxTokensField string
	AnthropicBaseURL     string
	AnthropicAPIKey      string
	// ModelsFile names a JSON file of further models and price overrides
	// (see registry.ModelsFile).
	ModelsFile string

	// SecretKey is the key sealing connection secrets (64 hex digits);
	// empty means the state directory's key file.
	SecretKey string

	// DebianMirror is where `ephemeral image build` gets the guest's
	// packages.
	DebianMirror string

	// StarterCreditMicros is credited to the organisation of every
	// account registered in the web app.
	StarterCreditMicros int64
	// SessionIdleTimeout ends a web session not used for this long;
	// SessionMaxAge ends every session this long after sign-in.
	SessionIdleTimeout time.Duration
	SessionMaxAge      time.Duration
	// VMMMemoryOverheadMiB and the Guest limits bound each sandbox (see
	// sandbox.Limits).
	VMMMemoryOverheadMiB  int
	GuestScratchMiB       int
	GuestTmpMiB           int
	GuestOverlayMiB       int
	GuestCommandProcesses int
}

// VMM choices.
const (
	VMMAuto            = "auto"
	VMMQEMU            = "qemu"
	VMMCloudHypervisor = "cloud-hypervisor"
)

// Defaults is the configuration nothing overrides.
func Defaults() Config {
	guest := limits.Defaults()
	return Config{
		StateDir:                 "/var/lib/ephemeral",
		NodeLease:                15 * time.Second,
		Listen:                   "127.0.0.1:8080",
		VMM:                      VMMAuto,
		Retention:                30 * 24 * time.Hour,
		JanitorInterval:          time.Hour,
		ShutdownTimeout:          30 * time.Second,
		MaxConcurrentRuns:        defaultCapacity(runtime.NumCPU(), totalMemory()),
		MaxActiveRunsPerOrg:      10,
		LimitKeyRunCreations:     10,
		LimitKeyReads:            50,
		LimitKeyStreams:          20,
		LimitAddressRunCreations: 20,
		LimitAddressReads:        100,
		LimitAddressStreams:      40,
		PoolSize:                 defaultPoolSize(runtime.NumCPU(), totalMemory()),
		MaxCostMicros:            100_000_000,
		MaxModelTurns:            20,
		CommandTimeout:           60 * time.Second,
		BootTimeout:              time.Minute,
		MaxRecordingBytes:        8 << 20,
		MaxTimelineBytes:         4 << 20,
		MaxOutputFileBytes:       10 << 20,
		MaxOutputBytes:           50 << 20,
		WebhookAttempts:          6,
		WebhookFirstRetry:        30 * time.Second,
		WebhookTimeout:           10 * time.Second,
		// No default model: which model a request runs with is not guessed.
		DefaultModel:             "",
		ComputeMicrosPerVMSecond: 240,
		WebMicrosPerRequest:      100,
		DebianMirror:             "http://deb.debian.org/debian",
		// $1.00: 25 runs of the product page's $0.04 budget.
		StarterCreditMicros:   1_000_000,
		SessionIdleTimeout:    7 * 24 * time.Hour,
		SessionMaxAge:         30 * 24 * time.Hour,
		VMMMemoryOverheadMiB:  vmm.DefaultMemoryOverheadMiB,
		GuestScratchMiB:       guest.ScratchMiB,
		GuestTmpMiB:           guest.TmpMiB,
		GuestOverlayMiB:       guest.OverlayMiB,
		GuestCommandProcesses: guest.CommandProcesses,
	}
}

// poolMemoryPerVM is the host memory the default pool size sets aside for
// each pooled sandbox: an idle one costs far less, but it is there to be
// taken by a run whose guest may fill its memory.
const poolMemoryPerVM = 2 << 30

// runMemory is what one executing run takes of the host's memory: its
// guest's RAM (512 MiB by default), the VMM's own and room for the host.
const runMemory = 1 << 30

// defaultCapacity is how many runs a machine executes at once: one per
// CPU, since each microVM needs about a core under TCG, and no more than
// its memory holds (all of it, when the memory is unknown).
func defaultCapacity(cpus int, memory uint64) int {
	if memory == 0 {
		return max(1, cpus)
	}
	return max(1, min(cpus, int(memory/runMemory)))
}

// defaultPoolSize keeps one sandbox ready per CPU, as many as runs may
// execute at once by default, but no more than the memory allows.
func defaultPoolSize(cpus int, memory uint64) int {
	return max(0, min(cpus, int(memory/poolMemoryPerVM)))
}

// ConfigFileSetting is the setting that names the configuration file; it
// is read from the flag or the environment only.
const ConfigFileSetting = "config"

// Setting is one row of the table.
type Setting struct {
	// Name is the flag (--name) and the file key.
	Name  string
	Usage string
	// Secret values are never printed.
	Secret bool
	// field points into a Config: *string, *int, *int64 or
	// *time.Duration. Nil only for ConfigFileSetting.
	field func(*Config) any
}

// Env is the setting's environment variable: EPHEMERAL_ and the name in
// upper case with dashes as underscores.
func (s Setting) Env() string {
	return "EPHEMERAL_" + strings.ToUpper(strings.ReplaceAll(s.Name, "-", "_"))
}

// Kind names the setting's type as a user writes it.
func (s Setting) Kind() string {
	if s.field == nil {
		return "path"
	}
	switch s.field(&Config{}).(type) {
	case *int, *int64:
		return "integer"
	case *time.Duration:
		return "duration"
	}
	return "string"
}

// DefaultText is the default value as a user would write it.
func (s Setting) DefaultText() string {
	if s.field == nil {
		return ""
	}
	d := Defaults()
	return format(s.field(&d))
}

// Value is the setting's value in c, as a user would write it.
func (s Setting) Value(c *Config) string {
	if s.field == nil {
		return ""
	}
	return format(s.field(c))
}

// Settings is the table, in the order help and --print-config list it.
var Settings = []Setting{
	{Name: ConfigFileSetting, Usage: "JSON configuration file; its keys are the setting names"},
	{Name: "state-dir", Usage: "directory for images, VM state, the database and the secret key", field: func(c *Config) any { return &c.StateDir }},
	{Name: "database", Usage: "empty: the embedded SQLite database in the state directory; postgres://user:password@host/db?sslmode=...: a PostgreSQL database that several daemons (nodes) share, each executing runs on its own machine", Secret: true, field: func(c *Config) any { return &c.Database }},
	{Name: "node-lease", Usage: "with a shared PostgreSQL database: how long a node may miss its heartbeats before another node fails its runs as node_lost (charging what was metered)", field: func(c *Config) any { return &c.NodeLease }},
	{Name: "listen", Usage: "address the API serves on (host:port)", field: func(c *Config) any { return &c.Listen }},
	{Name: "trusted-proxies", Usage: "load balancers or proxies in front of the daemon (addresses and CIDR prefixes, comma-separated) whose X-Forwarded-For (the client's address, for rate limits) and X-Forwarded-Proto (https: cookies are marked Secure) are believed; empty: none, every request is taken as it arrives", field: func(c *Config) any { return &c.TrustedProxies }},
	{Name: "metrics-listen", Usage: "address /metrics is served on (host:port), apart from the API; keep it on loopback: the metrics sum up every organisation. Empty: not served", field: func(c *Config) any { return &c.MetricsListen }},
	{Name: "vmm", Usage: "VMM: auto (Cloud Hypervisor with hardware KVM, else QEMU), qemu or cloud-hypervisor", field: func(c *Config) any { return &c.VMM }},
	{Name: "retention", Usage: "how long a run's content (prompt, timeline, output, recording) is kept", field: func(c *Config) any { return &c.Retention }},
	{Name: "janitor-interval", Usage: "how often expired content is purged", field: func(c *Config) any { return &c.JanitorInterval }},
	{Name: "shutdown-timeout", Usage: "how long a graceful shutdown waits for requests", field: func(c *Config) any { return &c.ShutdownTimeout }},
	{Name: "max-concurrent-runs", Usage: "runs this daemon (node) executes at once (default: one per CPU, at most one per GiB of memory)", field: func(c *Config) any { return &c.MaxConcurrentRuns }},
	{Name: "max-active-runs-per-org", Usage: "queued plus running runs per organisation before 429", field: func(c *Config) any { return &c.MaxActiveRunsPerOrg }},
	{Name: "limit-key-run-creations", Usage: "runs one API key may create per second, in bursts of twice as many, before 429", field: func(c *Config) any { return &c.LimitKeyRunCreations }},
	{Name: "limit-key-reads", Usage: "other API requests one API key may make per second, in bursts of twice as many, before 429", field: func(c *Config) any { return &c.LimitKeyReads }},
	{Name: "limit-key-streams", Usage: "event streams one API key may have open at once before 429", field: func(c *Config) any { return &c.LimitKeyStreams }},
	{Name: "limit-address-run-creations", Usage: "run creations per second from one client address (IPv6: one /64), in bursts of twice as many, before 429", field: func(c *Config) any { return &c.LimitAddressRunCreations }},
	{Name: "limit-address-reads", Usage: "other requests per second from one client address (IPv6: one /64), with or without a valid key, in bursts of twice as many, before 429", field: func(c *Config) any { return &c.LimitAddressReads }},
	{Name: "limit-address-streams", Usage: "event streams one client address (IPv6: one /64) may have open at once before 429", field: func(c *Config) any { return &c.LimitAddressStreams }},
	{Name: "pool-size", Usage: "sandboxes kept started and sealed, each handed to one run; they count toward max-concurrent-runs (default: one per CPU, at most one per 2 GiB of memory; 0: none)", field: func(c *Config) any { return &c.PoolSize }},
	{Name: "max-cost-micros", Usage: "largest max_cost_micros one run may ask for", field: func(c *Config) any { return &c.MaxCostMicros }},
	{Name: "max-model-turns", Usage: "model calls one run may make", field: func(c *Config) any { return &c.MaxModelTurns }},
	{Name: "command-timeout", Usage: "longest one shell command of the agent may run", field: func(c *Config) any { return &c.CommandTimeout }},
	{Name: "boot-timeout", Usage: "longest a run's microVM may take to be ready (the run then fails as boot_timeout); a run's timeout_seconds starts when its microVM is ready", field: func(c *Config) any { return &c.BootTimeout }},
	{Name: "max-recording-bytes", Usage: "bytes one run's recording of its model turns may store; later turns are not recorded and the recording is marked truncated", field: func(c *Config) any { return &c.MaxRecordingBytes }},
	{Name: "max-timeline-bytes", Usage: "bytes one run's timeline may store of commands, output and web calls; what passes it is left out, and a last entry says how much", field: func(c *Config) any { return &c.MaxTimelineBytes }},
	{Name: "max-output-file-bytes", Usage: "bytes one output file of a run may have; a larger one is skipped, and an Output entry says so", field: func(c *Config) any { return &c.MaxOutputFileBytes }},
	{Name: "max-output-bytes", Usage: "bytes the output files of one run may have together; files past it are skipped", field: func(c *Config) any { return &c.MaxOutputBytes }},
	{Name: "webhook-attempts", Usage: "POSTs one webhook delivery gets before it has failed", field: func(c *Config) any { return &c.WebhookAttempts }},
	{Name: "webhook-first-retry", Usage: "wait after a webhook's first failed attempt; each later wait is three times the one before, give or take 20%", field: func(c *Config) any { return &c.WebhookFirstRetry }},
	{Name: "webhook-timeout", Usage: "longest one webhook attempt may take, the receiver's answer included", field: func(c *Config) any { return &c.WebhookTimeout }},
	{Name: "default-model", Usage: "model a request that names none runs with; empty: such a request is refused (400 model_required, listing the usable models)", field: func(c *Config) any { return &c.DefaultModel }},
	{Name: "compute-micros-per-vm-second", Usage: "compute price in micro-dollars per VM-second", field: func(c *Config) any { return &c.ComputeMicrosPerVMSecond }},
	{Name: "web-micros-per-request", Usage: "price of one brokered web request in micro-dollars", field: func(c *Config) any { return &c.WebMicrosPerRequest }},
	{Name: "openai-base-url", Usage: "OpenAI-compatible Chat Completions base URL, ending before /chat/completions (OpenAI, OpenRouter, Ollama, vLLM, llama.cpp)", field: func(c *Config) any { return &c.OpenAIBaseURL }},
	{Name: "openai-api-key", Usage: "API key of the OpenAI-compatible provider", Secret: true, field: func(c *Config) any { return &c.OpenAIAPIKey }},
	{Name: "openai-max-tokens-field", Usage: "max_tokens or max_completion_tokens (default: the latter for OpenAI's own API)", field: func(c *Config) any { return &c.OpenAIMaxTokensField }},
	{Name: "anthropic-base-url", Usage: "Anthropic Messages base URL, ending before /v1/messages", field: func(c *Config) any { return &c.AnthropicBaseURL }},
	{Name: "anthropic-api-key", Usage: "Anthropic API key", Secret: true, field: func(c *Config) any { return &c.AnthropicAPIKey }},
	{Name: "models-file", Usage: `JSON file of models and prices: {"models":[{"name","provider","price"}]}`, field: func(c *Config) any { return &c.ModelsFile }},
	{Name: "secret-key", Usage: "key sealing connection secrets, 64 hex digits (default: <state-dir>/secret.key)", Secret: true, field: func(c *Config) any { return &c.SecretKey }},
	{Name: "debian-mirror", Usage: "Debian mirror the guest image is built from (ephemeral image build)", field: func(c *Config) any { return &c.DebianMirror }},
	{Name: "starter-credit-micros", Usage: "balance credited to the organisation of each account registered in the web app", field: func(c *Config) any { return &c.StarterCreditMicros }},
	{Name: "session-idle-timeout", Usage: "how long a web app session lasts without being used", field: func(c *Config) any { return &c.SessionIdleTimeout }},
	{Name: "session-max-age", Usage: "how long a web app session lasts at most after signing in", field: func(c *Config) any { return &c.SessionMaxAge }},
	{Name: "vmm-memory-overhead-mib", Usage: "memory (MiB) a VMM may use beyond its guest's RAM: its cgroup's memory limit is the guest's RAM plus this", field: func(c *Config) any { return &c.VMMMemoryOverheadMiB }},
	{Name: "guest-scratch-mib", Usage: "size (MiB, in the guest's RAM) of the scratch directory where commands run; a full one fails writes with ENOSPC", field: func(c *Config) any { return &c.GuestScratchMiB }},
	{Name: "guest-tmp-mib", Usage: "size (MiB, in the guest's RAM) of the guest's /tmp", field: func(c *Config) any { return &c.GuestTmpMiB }},
	{Name: "guest-overlay-mib", Usage: "what (MiB, in the guest's RAM) commands may write elsewhere in the guest's root filesystem, their home included", field: func(c *Config) any { return &c.GuestOverlayMiB }},
	{Name: "guest-command-processes", Usage: "processes and threads one command in the guest may have at once; a command that tries to pass it is killed with everything it started (the worker user may have four times as many across its commands)", field: func(c *Config) any { return &c.GuestCommandProcesses }},
}

// Lookup finds a setting by name.
func Lookup(name string) (Setting, bool) {
	for _, s := range Settings {
		if s.Name == name {
			return s, true
		}
	}
	return Setting{}, false
}

// Validate checks what no single value's type can: ranges and choices.
func (c Config) Validate() error {
	var problems []string
	bad := func(name, format string, args ...any) {
		problems = append(problems, name+": "+fmt.Sprintf(format, args...))
	}
	if c.StateDir == "" {
		bad("state-dir", "must not be empty")
	}
	if c.Database != "" && !strings.HasPrefix(c.Database, "postgres://") && !strings.HasPrefix(c.Database, "postgresql://") {
		bad("database", "want empty (SQLite in the state directory) or a postgres:// URL")
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		bad("listen", "want host:port, got %q", c.Listen)
	}
	if _, _, err := net.SplitHostPort(c.MetricsListen); c.MetricsListen != "" && err != nil {
		bad("metrics-listen", "want host:port or nothing, got %q", c.MetricsListen)
	}
	switch c.VMM {
	case VMMAuto, VMMQEMU, VMMCloudHypervisor:
	default:
		bad("vmm", "%q: want %s, %s or %s", c.VMM, VMMAuto, VMMQEMU, VMMCloudHypervisor)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"retention", c.Retention}, {"node-lease", c.NodeLease}, {"janitor-interval", c.JanitorInterval}, {"shutdown-timeout", c.ShutdownTimeout}, {"command-timeout", c.CommandTimeout},
		{"session-idle-timeout", c.SessionIdleTimeout}, {"session-max-age", c.SessionMaxAge},

		{"webhook-first-retry", c.WebhookFirstRetry}, {"webhook-timeout", c.WebhookTimeout}} {
		if d.v <= 0 {
			bad(d.name, "must be a positive duration, got %v", d.v)
		}
	}
	for _, n := range []struct {
		name string
		v    int64
	}{{"max-concurrent-runs", int64(c.MaxConcurrentRuns)}, {"max-active-runs-per-org", int64(c.MaxActiveRunsPerOrg)},
		{"max-cost-micros", c.MaxCostMicros}, {"max-model-turns", int64(c.MaxModelTurns)},
		{"max-recording-bytes", c.MaxRecordingBytes}, {"max-timeline-bytes", c.MaxTimelineBytes},
		{"max-output-file-bytes", c.MaxOutputFileBytes}, {"max-output-bytes", c.MaxOutputBytes}, {"webhook-attempts", int64(c.WebhookAttempts)},
		{"limit-key-run-creations", int64(c.LimitKeyRunCreations)}, {"limit-key-reads", int64(c.LimitKeyReads)},
		{"limit-key-streams", int64(c.LimitKeyStreams)}, {"limit-address-run-creations", int64(c.LimitAddressRunCreations)},
		{"limit-address-reads", int64(c.LimitAddressReads)}, {"limit-address-streams", int64(c.LimitAddressStreams)},
		{"vmm-memory-overhead-mib", int64(c.VMMMemoryOverheadMiB)}, {"guest-scratch-mib", int64(c.GuestScratchMiB)},
		{"guest-tmp-mib", int64(c.GuestTmpMiB)}, {"guest-overlay-mib", int64(c.GuestOverlayMiB)},
		{"guest-command-processes", int64(c.GuestCommandProcesses)}} {
		if n.v <= 0 {
			bad(n.name, "must be positive, got %d", n.v)
		}
	}
	for _, n := range []struct {
		name string
		v    int64
	}{{"compute-micros-per-vm-second", c.ComputeMicrosPerVMSecond}, {"web-micros-per-request", c.WebMicrosPerRequest},
		{"starter-credit-micros", c.StarterCreditMicros}, {"pool-size", int64(c.PoolSize)}} {
		if n.v < 0 {
			bad(n.name, "must not be negative, got %d", n.v)
		}
	}
	switch c.OpenAIMaxTokensField {
	case "", "max_tokens", "max_completion_tokens":
	default:
		bad("openai-max-tokens-field", "%q: want max_tokens or max_completion_tokens", c.OpenAIMaxTokensField)
	}
	if c.SecretKey != "" {
		if raw, err := hex.DecodeString(c.SecretKey); err != nil || len(raw) != 32 {
			bad("secret-key", "must be 64 hex digits")
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("config: %s", strings.Join(problems, "; "))
	}
	return nil
}
