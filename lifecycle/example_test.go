package lifecycle_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/pulse-agent/pulse/lifecycle"
)

func Example() {
	ctx := context.Background()
	e, _ := lifecycle.New("exec-42", lifecycle.WithHook(func(_ context.Context, t lifecycle.Transition) {
		fmt.Printf("%s: %s -> %s\n", t.ExecutionID, t.From, t.To)
	}))
	_ = e.Transition(ctx, lifecycle.Starting)
	_ = e.Transition(ctx, lifecycle.Running)
	err := e.Transition(ctx, lifecycle.Finalized)
	fmt.Println(errors.Is(err, lifecycle.ErrInvalidTransition), err)
	// Output:
	// exec-42: CREATED -> STARTING
	// exec-42: STARTING -> RUNNING
	// true lifecycle: execution "exec-42" cannot go from RUNNING to FINALIZED
}
