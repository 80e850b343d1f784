package main

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
)

func init() {
	register(command{
		name:    "version",
		summary: "print the module version, VCS revision and Go version",
		usage:   []string{"pulse version [--json]"},
		run:     runVersion,
	})
}

// versionInfo is what `pulse version` reports, from the build information
// the Go toolchain embeds.
type versionInfo struct {
	Module   string `json:"module"`
	Version  string `json:"version"`
	Revision string `json:"vcs_revision,omitempty"`
	Time     string `json:"vcs_time,omitempty"`
	Modified bool   `json:"vcs_modified,omitempty"`
	Go       string `json:"go_version"`
	Platform string `json:"platform"`
}

func buildVersion() versionInfo {
	v := versionInfo{Module: "github.com/pulse-agent/pulse", Version: "(devel)", Go: runtime.Version(),
		Platform: runtime.GOOS + "/" + runtime.GOARCH}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	if bi.Main.Path != "" {
		v.Module = bi.Main.Path
	}
	if bi.Main.Version != "" {
		v.Version = bi.Main.Version
	}
	v.Go = bi.GoVersion
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = s.Value
		case "vcs.time":
			v.Time = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v
}

func runVersion(_ context.Context, env *cliEnv, args []string) int {
	fs := newFlagSet(env, "version")
	asJSON := fs.Bool("json", false, "print the version as a JSON object")
	if code, done := parseNoArgs(env, fs, args); done {
		return code
	}
	v := buildVersion()
	if *asJSON {
		writeJSON(env.stdout, v)
		return exitOK
	}
	rev := v.Revision
	if rev == "" {
		rev = "unknown"
	}
	if v.Modified {
		rev += " (modified)"
	}
	fmt.Fprintf(env.stdout, "pulse %s\nmodule:   %s\nrevision: %s\ngo:       %s %s\n", v.Version, v.Module, rev, v.Go, v.Platform)
	return exitOK
}
