// Command nsonly is an SDK program that wants namespaces only: it imports
// the facade and backend/namespace, and TestFacadeLinksNoDockerClient
// checks that it links no Docker client.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/pulse-agent/pulse/backend/namespace"
	"github.com/pulse-agent/pulse/sandbox"
)

func main() {
	namespace.Init()
	sb, err := sandbox.New(context.Background(), ".")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer sb.Close()
	fmt.Println(sb.Backend().Name())
}
