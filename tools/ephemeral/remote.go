package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/ephemeralhq/ephemeral/hostd/ledger"
	"github.com/ephemeralhq/ephemeral/hostd/money"
	"github.com/ephemeralhq/ephemeral/tools/ephemeral/internal/client"
)

// The commands that call a daemon's API, in the manner of gh and stripe:
// ephemeral runs ... and ephemeral balance.

const remoteHelp = "They call the daemon at $EPHEMERAL_URL (--url) with the key in $EPHEMERAL_API_KEY (--api-key); " +
	"--json prints the API's objects as they come, one a line."

var runsCommand = &cli.Command{
	Name:        "runs",
	Usage:       "create, follow, list and manage runs on a daemon, through its API",
	Description: remoteHelp,
	Subcommands: []*cli.Command{
		{
			Name:  "create",
			Usage: "create a run from request.json or from flags; --follow prints its timeline as it happens",
			Description: "The request is a file (-f request.json, - for stdin) with the fields of POST /v1/runs, " +
				"and/or flags, which override the file's fields. Fields left out take the API's defaults (shell and web off).\n" +
				"Each run is created with a new Idempotency-Key (--verbose prints it; --idempotency-key sets it): " +
				"sending it again returns the same run.\n\n" +
				"With --follow the timeline is printed as ephemeral run prints it, then the output and the cost, " +
				"and a dropped connection is resumed where it stopped. " + exitCodesHelp,
			Flags: append(clientFlags(),
				&cli.StringFlag{Name: "file", Aliases: []string{"f"}, Usage: "request.json: the run request (- for stdin)"},
				&cli.StringFlag{Name: "prompt", Usage: "the task (prompt)"},
				&cli.StringFlag{Name: "model", Usage: "the model (model)", DefaultText: "the daemon's default-model"},
				&cli.BoolFlag{Name: "shell", Usage: "grant the shell in the microVM (shell)"},
				&cli.BoolFlag{Name: "web", Usage: "grant web access through the broker (web)"},
				&cli.StringSliceFlag{Name: "connection", Usage: "grant a connection, NAME:METHOD[,METHOD...] (connections; repeatable)"},
				&cli.StringSliceFlag{Name: "input", Usage: "put a local file in the run's scratch directory, PATH=LOCAL_FILE (files; repeatable)"},
				&cli.Int64Flag{Name: "timeout-seconds", Usage: "hard timeout (timeout_seconds)", DefaultText: "the API's, 120"},
				&cli.Int64Flag{Name: "max-cost-micros", Usage: "hard budget in micro-dollars, 40000 = $0.04 (max_cost_micros)", DefaultText: "none: required"},
				&cli.BoolFlag{Name: "zero-data-retention", Usage: "keep no prompt, timeline content or recording (zero_data_retention)"},
				&cli.StringFlag{Name: "idempotency-key", Usage: "Idempotency-Key to send (default: a new random one)"},
				&cli.BoolFlag{Name: "follow", Usage: "print the timeline as it happens, exit with the run's outcome"},
			),
			Action: createRun,
		},
		{
			Name: "get", Usage: "print a run", ArgsUsage: "RUN_ID", Flags: clientFlags(),
			Action: func(c *cli.Context) error {
				return withClient(c, 1, func(cl *client.Client, args []string) error {
					run, err := cl.GetRun(c.Context, args[0])
					if err != nil {
						return err
					}
					if c.Bool("json") {
						return printJSONLine(c.App.Writer, run.Raw)
					}
					printRun(c.App.Writer, run)
					return nil
				})
			},
		},
		{
			Name: "list", Usage: "list runs, newest first", Flags: append(clientFlags(),
				&cli.StringFlag{Name: "status", Usage: "only runs in this status: queued, running, succeeded, failed, timed_out, budget_exceeded, canceled"},
				&cli.IntFlag{Name: "limit", Usage: "runs per page, 1 to 100", DefaultText: "the API's, 20"},
				&cli.StringFlag{Name: "starting-after", Usage: "the page after this run id (the cursor the previous page printed)"},
				&cli.BoolFlag{Name: "all", Usage: "every page, not just the first"},
			),
			Description: "With --json each page is printed as the API's list object, one a line.",
			Action:      listRuns,
		},
		{
			Name: "events", Usage: "print a run's timeline; --follow waits for the rest", ArgsUsage: "RUN_ID",
			Description: "Without --follow, the timeline as it is now, each entry with its latest data. With --follow, " +
				"entries as they happen until the run ends, then its output and cost; a dropped connection is " +
				"resumed with Last-Event-ID and nothing is printed twice. " + exitCodesHelp,
			Flags: append(clientFlags(), &cli.BoolFlag{Name: "follow", Usage: "follow the run live until it ends"}),
			Action: func(c *cli.Context) error {
				return withClient(c, 1, func(cl *client.Client, args []string) error {
					if c.Bool("follow") {
						return followRun(c, cl, args[0])
					}
					return printEvents(c, cl, args[0])
				})
			},
		},
		{
			Name: "cancel", Usage: "stop a run; its budget is settled for what it used", ArgsUsage: "RUN_ID", Flags: clientFlags(),
			Action: func(c *cli.Context) error {
				return withClient(c, 1, func(cl *client.Client, args []string) error {
					run, err := cl.CancelRun(c.Context, args[0])
					if err != nil {
						return err
					}
					if c.Bool("json") {
						return printJSONLine(c.App.Writer, run.Raw)
					}
					fmt.Fprintf(c.App.Writer, "%s: %s\n", printable(run.ID), printable(run.Status))
					return nil
				})
			},
		},
		{
			Name: "delete", Usage: "purge a finished run's content (prompt, timeline, output, recording); its cost stays",
			ArgsUsage: "RUN_ID", Flags: clientFlags(),
			Action: func(c *cli.Context) error {
				return withClient(c, 1, func(cl *client.Client, args []string) error {
					run, err := cl.DeleteRun(c.Context, args[0])
					if err != nil {
						return err
					}
					if c.Bool("json") {
						return printJSONLine(c.App.Writer, run.Raw)
					}
					fmt.Fprintf(c.App.Writer, "%s: content purged\n", printable(run.ID))
					return nil
				})
			},
		},
		{
			Name: "recording", Usage: "save a run's recording of its model turns, for ephemeral run --replay", ArgsUsage: "RUN_ID",
			Flags: append(clientFlags(), &cli.StringFlag{Name: "output", Aliases: []string{"o"}, Usage: "write it to this file (default: stdout)"}),
			Action: func(c *cli.Context) error {
				return withClient(c, 1, func(cl *client.Client, args []string) error {
					doc, err := cl.Recording(c.Context, args[0])
					if err != nil {
						return err
					}
					path := c.String("output")
					if path == "" || path == "-" {
						_, err := c.App.Writer.Write(append(bytes.TrimSpace(doc), '\n'))
						return err
					}
					// The recording holds the run's prompt and answers.
					if err := os.WriteFile(path, doc, 0o600); err != nil {
						return fmt.Errorf("runs recording: %w", err)
					}
					fmt.Fprintf(c.App.ErrWriter, "saved the recording of %s to %s; replay it with ephemeral run --replay %s\n", args[0], path, path)
					return nil
				})
			},
		},
	},
}

var balanceCommand = &cli.Command{
	Name:        "balance",
	Usage:       "print your organisation's balance, through the API",
	Description: remoteHelp,
	Flags:       clientFlags(),
	Action: func(c *cli.Context) error {
		return withClient(c, 0, func(cl *client.Client, _ []string) error {
			b, err := cl.Balance(c.Context)
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSONLine(c.App.Writer, b.Raw)
			}
			printBalance(c.App.Writer, ledger.Account{Available: b.Available, Held: b.Held, Charged: b.Charged, Credited: b.Credited})
			return nil
		})
	},
}

// withClient checks the command has n arguments and calls action with a
// client and them; an API error is prefixed with the command.
func withClient(c *cli.Context, n int, action func(*client.Client, []string) error) error {
	args := c.Args().Slice()
	if len(args) != n {
		want := "no arguments"
		if n > 0 {
			want = "exactly one argument " + c.Command.ArgsUsage
		}
		return fmt.Errorf("%s: expected %s, got %d", commandPath(c), want, len(args))
	}
	cl, err := newClient(c)
	if err != nil {
		return err
	}
	if err := action(cl, args); err != nil {
		var exit cli.ExitCoder
		if errors.As(err, &exit) {
			return err
		}
		return fmt.Errorf("%s: %w", commandPath(c), err)
	}
	return nil
}

func createRun(c *cli.Context) error {
	return withClient(c, 0, func(cl *client.Client, _ []string) error {
		body, err := runRequest(c)
		if err != nil {
			return err
		}
		key := c.String("idempotency-key")
		if key == "" {
			key = client.NewIdempotencyKey()
		}
		run, created, err := cl.CreateRun(c.Context, body, key)
		if err != nil {
			return err
		}
		if c.Bool("json") {
			if err := printJSONLine(c.App.Writer, run.Raw); err != nil {
				return err
			}
		} else {
			how := "created"
			if !created {
				how = "created earlier with this Idempotency-Key"
			}
			fmt.Fprintf(c.App.Writer, "%s  model %s, %s, %s\n", printable(run.ID), printable(run.Model), printable(run.Status), how)
		}
		if !c.Bool("follow") {
			if !c.Bool("json") {
				fmt.Fprintf(c.App.ErrWriter, "follow it with: ephemeral runs events %s --follow\n", printable(run.ID))
			}
			return nil
		}
		if !c.Bool("json") {
			fmt.Fprintln(c.App.Writer)
		}
		return followRun(c, cl, run.ID)
	})
}

// runRequest is the body of POST /v1/runs: the file's object, if any, with
// the fields the flags give set over it.
func runRequest(c *cli.Context) ([]byte, error) {
	fields := map[string]any{}
	for _, f := range []struct{ flag, field string }{
		{"prompt", "prompt"}, {"model", "model"}, {"shell", "shell"}, {"web", "web"},
		{"timeout-seconds", "timeout_seconds"}, {"max-cost-micros", "max_cost_micros"}, {"zero-data-retention", "zero_data_retention"},
	} {
		if c.IsSet(f.flag) {
			fields[f.field] = c.Value(f.flag)
		}
	}
	if c.IsSet("connection") {
		var conns []map[string]any
		for _, v := range c.StringSlice("connection") {
			name, methods, ok := strings.Cut(v, ":")
			if !ok || name == "" || methods == "" {
				return nil, fmt.Errorf("--connection %q: want NAME:METHOD[,METHOD...], e.g. crm:GET,HEAD", v)
			}
			conns = append(conns, map[string]any{"name": name, "methods": strings.Split(methods, ",")})
		}
		fields["connections"] = conns
	}
	if c.IsSet("input") {
		var files []map[string]any
		for _, v := range c.StringSlice("input") {
			path, local, ok := strings.Cut(v, "=")
			if !ok || path == "" || local == "" {
				return nil, fmt.Errorf("--input %q: want PATH=LOCAL_FILE, e.g. data.csv=./data.csv", v)
			}
			content, err := os.ReadFile(local)
			if err != nil {
				return nil, fmt.Errorf("--input %s: %w", v, err)
			}
			files = append(files, map[string]any{"path": path, "content": string(content)})
		}
		fields["files"] = files
	}

	path := c.String("file")
	if path == "" {
		if _, ok := fields["prompt"]; !ok {
			return nil, errors.New("give the request as -f request.json, or at least --prompt and --max-cost-micros")
		}
		return json.Marshal(fields)
	}
	file, err := readRequestFile(c, path)
	if err != nil {
		return nil, err
	}
	if len(fields) == 0 {
		return file, nil // verbatim: the API checks it, field by field
	}
	object, err := requestObject(file)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	for k, v := range fields {
		b, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		object[k] = b
	}
	return json.Marshal(object)
}

// maxRequestBytes is the API's limit on a request body.
const maxRequestBytes = 1 << 20

func readRequestFile(c *cli.Context, path string) ([]byte, error) {
	var r io.Reader
	if path == "-" {
		r = os.Stdin
	} else {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	b, err := io.ReadAll(io.LimitReader(r, maxRequestBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(b) > maxRequestBytes {
		return nil, fmt.Errorf("%s is over %d bytes, the API's limit on a request", path, maxRequestBytes)
	}
	return b, nil
}

// requestObject decodes a request into its fields, to set flags over
// them. A field given twice is refused, as the API refuses it: which of
// two permissions was meant is not for the CLI to guess.
func requestObject(b []byte) (map[string]json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, errors.New("the request is not a JSON object")
	}
	object := map[string]json.RawMessage{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("the request is not valid JSON: %w", err)
		}
		name := t.(string)
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return nil, fmt.Errorf("the request is not valid JSON: %w", err)
		}
		if _, dup := object[name]; dup {
			return nil, fmt.Errorf("parameter %q is given more than once", name)
		}
		object[name] = value
	}
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("the request is not valid JSON: %w", err)
	}
	if dec.More() {
		return nil, errors.New("the request holds more than one JSON value")
	}
	return object, nil
}

// followRun follows a run's timeline to its end, prints it as ephemeral
// run does (or, with --json, the entries and then the ended run as the API
// sends them) and returns the run's outcome. Ctrl-C stops following, not
// the run.
func followRun(c *cli.Context, cl *client.Client, id string) error {
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	out := c.App.Writer
	printer := newTimelinePrinter(out)
	_, err := cl.FollowEvents(ctx, id, 0, func(ev client.Event) error {
		if c.Bool("json") {
			return printJSONLine(out, ev.Raw)
		}
		printer.stream(entryFromAPI(ev))
		return nil
	})
	if ctx.Err() != nil && c.Context.Err() == nil {
		return cli.Exit(fmt.Sprintf("ephemeral: stopped following %s; it goes on (ephemeral runs events %s --follow, or runs cancel %s)", id, id, id), 130)
	}
	if err != nil {
		return err
	}
	run, err := cl.GetRun(c.Context, id)
	if err != nil {
		return err
	}
	if c.Bool("json") {
		if err := printJSONLine(out, run.Raw); err != nil {
			return err
		}
	} else {
		printer.finish()
		printOutcome(out, "Output", run.Output, run.Cost.Model, run.Cost.Web, run.Cost.Compute)
	}
	var message string
	if run.Error != nil {
		message = run.Error.Message
	}
	// The run object is the record of how it ended.
	return runOutcome(run.Status, message)
}

// printEvents prints a run's timeline as it is now, every page of it.
func printEvents(c *cli.Context, cl *client.Client, id string) error {
	var all []client.Event
	var status string
	for after := int64(0); ; {
		page, err := cl.Events(c.Context, id, after)
		if err != nil {
			return err
		}
		all, status = append(all, page.Data...), page.RunStatus
		if !page.HasMore || len(page.Data) == 0 {
			break
		}
		after = page.Data[len(page.Data)-1].ID
	}
	if c.Bool("json") {
		for _, ev := range all {
			if err := printJSONLine(c.App.Writer, ev.Raw); err != nil {
				return err
			}
		}
		return nil
	}
	printer := newTimelinePrinter(c.App.Writer)
	for _, ev := range all {
		printer.print(entryFromAPI(ev))
	}
	printer.finish()
	if !client.Terminal(status) {
		fmt.Fprintf(c.App.ErrWriter, "%s is %s; follow it with: ephemeral runs events %s --follow\n", id, status, id)
	}
	return nil
}

func listRuns(c *cli.Context) error {
	return withClient(c, 0, func(cl *client.Client, _ []string) error {
		params := client.ListParams{Status: c.String("status"), Limit: c.Int("limit"), StartingAfter: c.String("starting-after")}
		w := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
		if !c.Bool("json") {
			fmt.Fprintln(w, "ID\tSTATUS\tMODEL\tCREATED\tCHARGED")
		}
		var more string // the cursor of the page not printed
		for {
			page, raw, err := cl.ListRuns(c.Context, params)
			if err != nil {
				return err
			}
			if c.Bool("json") {
				if err := printJSONLine(c.App.Writer, raw); err != nil {
					return err
				}
			}
			for _, r := range page.Data {
				if !c.Bool("json") {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", printable(r.ID), printable(r.Status), printable(r.Model), formatTime(&r.CreatedAt), money.Format(r.Cost.Charged))
				}
			}
			if !page.HasMore || page.NextCursor == nil {
				break
			}
			if !c.Bool("all") {
				more = *page.NextCursor
				break
			}
			params.StartingAfter = *page.NextCursor
		}
		if err := w.Flush(); err != nil {
			return err
		}
		if more != "" && !c.Bool("json") {
			fmt.Fprintf(c.App.ErrWriter, "more: ephemeral runs list --starting-after %s (or --all)\n", more)
		}
		return nil
	})
}

// printRun prints a run for people.
func printRun(w io.Writer, r client.Run) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "id:\t%s\n", printable(r.ID))
	fmt.Fprintf(tw, "status:\t%s\n", printable(r.Status))
	if r.Error != nil {
		fmt.Fprintf(tw, "error:\t%s: %s\n", printable(r.Error.Code), printable(r.Error.Message))
	}
	fmt.Fprintf(tw, "model:\t%s\n", printable(r.Model))
	fmt.Fprintf(tw, "created:\t%s\n", formatTime(&r.CreatedAt))
	if r.StartedAt != nil {
		fmt.Fprintf(tw, "started:\t%s\n", formatTime(r.StartedAt))
	}
	if r.FinishedAt != nil {
		fmt.Fprintf(tw, "finished:\t%s\n", formatTime(r.FinishedAt))
	}
	u := r.Usage
	fmt.Fprintf(tw, "usage:\t%s model calls, %s tokens, %s shell commands, %s web requests, %.1f VM-seconds\n",
		money.Count(u.ModelCalls), money.Count(u.Tokens), money.Count(u.ShellCommands), money.Count(u.WebRequests), u.VMSeconds)
	k := r.Cost
	fmt.Fprintf(tw, "cost:\t%s reserved, %s charged, %s released (model %s · web %s · compute %s)\n",
		money.Format(k.Reserved), money.Format(k.Charged), money.Format(k.Released), money.Format(k.Model), money.Format(k.Web), money.Format(k.Compute))
	switch {
	case r.PurgedAt != nil:
		fmt.Fprintf(tw, "content:\tpurged %s\n", formatTime(r.PurgedAt))
	case r.RetentionExpiresAt != nil:
		fmt.Fprintf(tw, "content:\tkept until %s\n", formatTime(r.RetentionExpiresAt))
	}
	tw.Flush()
	if r.Output != nil {
		fmt.Fprintf(w, "\nOutput:\n%s\n", printable(*r.Output))
	}
}

// printJSONLine prints an API object on one line.
func printJSONLine(w io.Writer, raw json.RawMessage) error {
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return fmt.Errorf("the API sent invalid JSON: %w", err)
	}
	buf.WriteByte('\n')
	_, err := w.Write(buf.Bytes())
	return err
}

// hoistFlags moves the flags typed after a remote command's arguments in
// front of them, so that `ephemeral runs get RUN_ID --json` means what it
// says: urfave/cli v2 stops reading flags at the first argument. Only the
// commands under roots are rearranged (sandbox exec passes its arguments
// on untouched), and nothing after "--".
func hoistFlags(args []string, roots ...*cli.Command) []string {
	start, cmd := 0, (*cli.Command)(nil)
	for i := 1; i < len(args) && cmd == nil; i++ {
		if strings.HasPrefix(args[i], "-") {
			continue // a flag of the program, before its command
		}
		for _, r := range roots {
			if r.HasName(args[i]) {
				start, cmd = i+1, r
			}
		}
		if cmd == nil {
			return args // another command
		}
	}
	if cmd == nil {
		return args
	}
	for start < len(args) {
		sub := cmd.Command(args[start])
		if sub == nil {
			break
		}
		start, cmd = start+1, sub
	}
	takesValue := map[string]bool{}
	for _, f := range cmd.Flags {
		_, isBool := f.(*cli.BoolFlag)
		for _, name := range f.Names() {
			takesValue[name] = !isBool
		}
	}
	var flags, positional []string
	for i := start; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			positional = append(positional, args[i:]...)
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			positional = append(positional, a)
			continue
		}
		flags = append(flags, a)
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if takesValue[name] && !hasValue && i+1 < len(args) {
			flags = append(flags, args[i+1])
			i++
		}
	}
	out := append([]string{}, args[:start]...)
	return append(append(out, flags...), positional...)
}
