package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/pulse-agent/pulse/sandbox"
)

// The unsafe host opt-in alone is consent to running unisolated, not to
// dropping rules: under the default policy (network and secrets denied) a
// command is refused, naming what the host cannot enforce, until those
// rules are accepted by name.
func ExampleWithUnsafeHostExecution() {
	ctx := context.Background()
	ws := newWorkspace()
	defer os.RemoveAll(ws)

	sb, err := sandbox.New(ctx, ws, sandbox.WithBackendName("host"), sandbox.WithUnsafeHostExecution())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sb.Close()
	_, err = sb.Execute(ctx, sandbox.Command{Shell: "echo hi"})
	var he *sandbox.HostRuleError
	if errors.As(err, &he) {
		fmt.Println("refused:", errors.Is(err, sandbox.ErrHostCannotEnforce), he.Rules)
	}

	sb2, err := sandbox.New(ctx, ws, sandbox.WithBackendName("host"),
		sandbox.WithUnsafeHostExecution(sandbox.UnsafeNetwork, sandbox.UnsafeSecrets))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sb2.Close()
	res, err := sb2.Execute(ctx, sandbox.Command{Shell: "echo hi"})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Print("accepted: ", res.Stdout)
	// Output:
	// refused: true [network secrets]
	// accepted: hi
}
