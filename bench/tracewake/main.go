// Command tracewake reads a Go execution trace (a server's /debug/pprof/trace, as
// bench/operator.py --profile takes the apiserver's in each burst) and prints, per second of
// the trace, the system calls by where they were made, and the goroutines woken by what they
// waited for and what woke them: how often the server wrote to etcd, and for whom it woke.
//
//	go run . [-top 15] FILE.trace
package main

import (
	"cmp"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"

	"golang.org/x/exp/trace"
)

// Frames of these packages say how, not for whom: a call site is named by the first others.
var plumbing = []string{"runtime.", "syscall.", "poll.", "net.", "os.", "bufio.", "tls.", "sync."}

func site(stack trace.Stack, depth int) string {
	var names []string
	for frame := range stack.Frames() {
		name := frame.Func[strings.LastIndex(frame.Func, "/")+1:]
		if slices.ContainsFunc(plumbing, func(p string) bool { return strings.HasPrefix(name, p) }) {
			continue
		}
		if names = append(names, name); len(names) == depth {
			break
		}
	}
	if len(names) == 0 {
		return "(no stack)"
	}
	return strings.Join(names, " < ")
}

type tally struct {
	count int
	ns    trace.Time
}

func main() {
	top := flag.Int("top", 15, "rows per table (1 or more)")
	flag.Parse()
	if flag.NArg() != 1 || *top < 1 {
		fmt.Fprintln(os.Stderr, "usage: tracewake [-top N] FILE.trace (N at least 1)")
		os.Exit(2)
	}
	file, err := os.Open(flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer file.Close()
	reader, err := trace.NewReader(file)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s is not a Go execution trace: %v\n", flag.Arg(0), err)
		os.Exit(1)
	}
	type entered struct {
		at    trace.Time
		where string
	}
	inSyscall := map[trace.GoID]entered{}
	waitingFor := map[trace.GoID]string{}
	syscalls := map[string]*tally{}
	wakeups := map[string]*tally{}
	var first, last trace.Time
	seen := false
	for {
		event, err := reader.ReadEvent()
		if err == io.EOF {
			break
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", flag.Arg(0), err)
			os.Exit(1)
		}
		if !seen {
			first, seen = event.Time(), true
		}
		last = event.Time()
		if event.Kind() != trace.EventStateTransition {
			continue
		}
		transition := event.StateTransition()
		if transition.Resource.Kind != trace.ResourceGoroutine {
			continue
		}
		goroutine := transition.Resource.Goroutine()
		from, to := transition.Goroutine()
		switch {
		case from == trace.GoRunning && to == trace.GoSyscall:
			inSyscall[goroutine] = entered{event.Time(), site(event.Stack(), 2)}
		case from == trace.GoSyscall:
			if call, ok := inSyscall[goroutine]; ok {
				add(syscalls, call.where, event.Time()-call.at)
				delete(inSyscall, goroutine)
			}
		case to == trace.GoWaiting:
			waitingFor[goroutine] = transition.Reason + ": " + site(event.Stack(), 2)
		case from == trace.GoWaiting && to == trace.GoRunnable:
			waited, known := waitingFor[goroutine]
			if !known {
				waited = "(waiting since before the trace)"
			}
			by := "the network poller or a timer"
			if event.Goroutine() != trace.NoGoroutine {
				by = site(event.Stack(), 2)
			}
			add(wakeups, waited+"  woken by  "+by, 0)
		}
	}
	seconds := float64(last-first) / 1e9
	if seconds <= 0 {
		fmt.Fprintf(os.Stderr, "%s: the trace spans no time (fewer than two events); take a longer one\n", flag.Arg(0))
		os.Exit(1)
	}
	fmt.Printf("%s: %.2f s traced\n", flag.Arg(0), seconds)
	show("system calls by where they were made (per second, and ms in them per second)", syscalls, seconds, *top, true)
	show("goroutines woken, by what they waited for and what woke them (per second)", wakeups, seconds, *top, false)
}

func add(tallies map[string]*tally, key string, ns trace.Time) {
	counted := tallies[key]
	if counted == nil {
		counted = &tally{}
		tallies[key] = counted
	}
	counted.count++
	counted.ns += ns
}

func show(title string, tallies map[string]*tally, seconds float64, top int, timed bool) {
	total := 0
	for _, counted := range tallies {
		total += counted.count
	}
	fmt.Printf("\n%s: %.0f per second in all\n", title, float64(total)/seconds)
	keys := slices.SortedFunc(maps.Keys(tallies), func(a, b string) int {
		return cmp.Or(cmp.Compare(tallies[b].count, tallies[a].count), strings.Compare(a, b))
	})
	for _, key := range keys[:min(top, len(keys))] {
		counted := tallies[key]
		if timed {
			fmt.Printf("%8.0f %8.1f  %s\n", float64(counted.count)/seconds, float64(counted.ns)/1e6/seconds, key)
		} else {
			fmt.Printf("%8.0f  %s\n", float64(counted.count)/seconds, key)
		}
	}
}
