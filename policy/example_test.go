package policy_test

import (
	"fmt"

	"github.com/pulse-agent/pulse/policy"
)

func ExampleParse() {
	p, err := policy.Parse([]byte(`
defaults:
  shell: deny
rules:
  - {action: shell, target: "go *", decision: allow}
  - {action: read, target: ".env", decision: deny}
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(p.Evaluate(policy.Shell, "go test ./..."))
	fmt.Println(p.Evaluate(policy.Shell, "curl example.com"))
	fmt.Println(p.Evaluate(policy.Read, "./.env"))
	fmt.Println(p.Evaluate(policy.Write, "main.go"))
	fmt.Println(p.Allowed(policy.Network))
	// Output:
	// allow
	// deny
	// deny
	// ask
	// false
}

func ExampleParse_error() {
	_, err := policy.Parse([]byte("rules:\n  - {action: exec, target: x, decision: allow}\n"))
	fmt.Println(err)
	// Output:
	// line 2: rules[0].action: invalid policy: unknown action "exec" (want one of read, write, delete, shell, git, network, secrets)
}
