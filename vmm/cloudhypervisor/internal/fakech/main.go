// Command fakech stands in for the cloud-hypervisor binary in the driver's
// tests, on machines where the real VMM cannot run. It serves the REST API
// on --api-socket, judges every request by Cloud Hypervisor's published API
// description (and every successful answer too), keeps the VM's lifecycle
// state, accepts tap descriptors passed as SCM_RIGHTS (vm.add-net, and
// vm.restore's net_fds), prints a boot banner and the guest init's "waiting
// for the host" line on its stdout (the serial port in Tty mode), writes and
// reads snapshot directories laid out like the real VMM's, and, once booted
// or resumed, answers the hybrid vsock CONNECT handshake on the VM's vsock
// socket and echoes bytes back as the guest.
//
// Tests steer it with environment variables:
//
//	FAKECH_SPEC             path of the OpenAPI document (required)
//	FAKECH_FAIL=op=message  answer op (e.g. vm.boot) with a VMM error chain
//	FAKECH_BLOCK=op=path    on op, create the file path and never answer
//	FAKECH_EXIT_EARLY=msg   print msg on stderr and exit 1 before serving
//	FAKECH_CHILD_PIDFILE    spawn a child that sleeps, writing its pid here
//	FAKECH_REFUSE_CONNECTS  close this many vsock connections unanswered
//	                        first, like a guest whose init is not up yet
package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ephemeralhq/ephemeral/vmm/cloudhypervisor/internal/chspec"
)

func main() {
	if len(os.Args) == 2 && os.Args[1] == "--fake-child" {
		time.Sleep(time.Hour) // killed with the process group
		return
	}
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "fakech: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	if msg := os.Getenv("FAKECH_EXIT_EARLY"); msg != "" {
		return fmt.Errorf("%s", msg)
	}
	apiSock, err := apiSocketArg(os.Args[1:])
	if err != nil {
		return err
	}
	contract, err := chspec.Load(context.Background(), os.Getenv("FAKECH_SPEC"))
	if err != nil {
		return err
	}
	if pidFile := os.Getenv("FAKECH_CHILD_PIDFILE"); pidFile != "" {
		if err := spawnChild(pidFile); err != nil {
			return err
		}
	}
	refuse, _ := strconv.Atoi(os.Getenv("FAKECH_REFUSE_CONNECTS"))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	v := &vmm{
		contract:       contract,
		fail:           opSetting("FAKECH_FAIL"),
		block:          opSetting("FAKECH_BLOCK"),
		refuseConnects: refuse,
		state:          stateNone,
	}
	return v.serve(ctx, apiSock)
}

// apiSocketArg extracts the path of "--api-socket path=<p>".
func apiSocketArg(args []string) (string, error) {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "--api-socket" {
			if p, ok := strings.CutPrefix(args[i+1], "path="); ok && p != "" {
				return p, nil
			}
			return "", fmt.Errorf("--api-socket %q: want path=<socket>", args[i+1])
		}
	}
	return "", fmt.Errorf("no --api-socket in %q", args)
}

// opSetting parses "op=value" from the environment variable name.
func opSetting(name string) map[string]string {
	op, value, ok := strings.Cut(os.Getenv(name), "=")
	if !ok {
		return nil
	}
	return map[string]string{op: value}
}

// spawnChild starts a long sleeper in fakech's process group, standing for
// a helper process the real VMM could leave behind.
func spawnChild(pidFile string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	child := exec.Command(self, "--fake-child")
	if err := child.Start(); err != nil {
		return fmt.Errorf("spawn child: %w", err)
	}
	return os.WriteFile(pidFile, []byte(strconv.Itoa(child.Process.Pid)), 0o644)
}
