package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/cowfs"
)

// txWatchBackend is ovBackend that also records how many transactions the
// workspace held while the command ran.
type txWatchBackend struct {
	ovBackend
	ws      string
	duringN int
	ran     bool
}

func (w *txWatchBackend) Exec(ctx context.Context, r *backend.Request) (*backend.Result, error) {
	w.ran = true
	ents, _ := os.ReadDir(filepath.Join(w.ws, ".pulse", "cow", "tx"))
	w.duringN = len(ents)
	return w.ovBackend.Exec(ctx, r)
}

// TestNoTransactionWithoutWrites: a command that wrote nothing, or only
// paths that are refused, makes no transaction (none exists while it runs,
// none after), and its audit events are all written; one that wrote
// something gets its transaction after it ran. With a bound on open
// transactions the slot is still taken before the command, which is
// refused, not run, when the bound is reached.
func TestNoTransactionWithoutWrites(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		ov     *backend.Overlay
		staged bool
	}{
		{"nothing written", nil, false},
		{"empty overlay", &backend.Overlay{}, false},
		{"only a refused path", &backend.Overlay{Files: []backend.File{{Path: ".pulse/evil", Mode: 0o644, Data: []byte("x")}}}, false},
		{"a file written", &backend.Overlay{Files: []backend.File{{Path: "new.txt", Mode: 0o644, Data: []byte("x")}}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws, _ := filepath.EvalSymlinks(t.TempDir())
			be := &txWatchBackend{ovBackend: ovBackend{ov: tc.ov}, ws: ws}
			sb, err := New(ctx, ws, withGetenv(noEnv), WithBackend(be))
			if err != nil {
				t.Fatal(err)
			}
			defer sb.Close()
			res, err := sb.Execute(ctx, Command{Args: []string{"true"}, ExecutionID: "exec-notx"})
			if err != nil {
				t.Fatal(err)
			}
			if be.duringN != 0 {
				t.Errorf("%d transactions existed while the command ran", be.duringN)
			}
			st, err := sb.Stack(ctx)
			if err != nil {
				t.Fatal(err)
			}
			want := 0
			if tc.staged {
				want = 1
			}
			if (res.Transaction != "") != tc.staged || len(st) != want {
				t.Fatalf("transaction %q, staged %q, stack of %d", res.Transaction, res.Staged, len(st))
			}
			raw, err := os.ReadFile(filepath.Join(ws, ".pulse", "audit.jsonl"))
			if err != nil {
				t.Fatal(err)
			}
			log := string(raw)
			if n := strings.Count(log, `"exec-notx"`); n < 2 || !strings.Contains(log, `"action":"shell"`) {
				t.Errorf("audit log holds %d events of the command:\n%s", n, log)
			}
			if len(res.Refused) > 0 && !strings.Contains(log, `"decision":"deny"`) {
				t.Errorf("refused path not audited:\n%s", log)
			}
		})
	}

	t.Run("bounded store", func(t *testing.T) {
		ws, _ := filepath.EvalSymlinks(t.TempDir())
		be := &txWatchBackend{ws: ws}
		sb, err := New(ctx, ws, withGetenv(noEnv), WithBackend(be), withCOWOptions(cowfs.WithMaxOpenTransactions(1)))
		if err != nil {
			t.Fatal(err)
		}
		defer sb.Close()
		if _, err := sb.Execute(ctx, Command{Args: []string{"true"}}); err != nil {
			t.Fatal(err)
		}
		if be.duringN != 1 {
			t.Errorf("bounded store: %d transactions while the command ran, want its own", be.duringN)
		}
		tx, err := sb.BeginTx(ctx, "holds the only slot")
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Discard(ctx)
		be.ran = false
		var le *cowfs.LimitError
		if _, err := sb.Execute(ctx, Command{Args: []string{"true"}}); !errors.As(err, &le) {
			t.Fatalf("Execute with the bound reached: %v, want a cowfs.LimitError", err)
		}
		if be.ran {
			t.Error("the command ran although its writes could not have been staged")
		}
	})
}
