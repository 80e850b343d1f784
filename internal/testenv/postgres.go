package testenv

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// PostgresCluster is a throwaway PostgreSQL cluster: its own data
// directory, listening only on a Unix socket in a private directory, with
// fsync off (nothing in it outlives the test). Every database in it is
// reachable without a password.
type PostgresCluster struct {
	dir, bin, data string
	cred           *syscall.Credential
	n              atomic.Int64
}

// postgresBin finds the directory of initdb and pg_ctl: PULSE_POSTGRES_BIN,
// else Debian's /usr/lib/postgresql/<newest>/bin, else PATH.
func postgresBin() (string, error) {
	if d := os.Getenv("PULSE_POSTGRES_BIN"); d != "" {
		return d, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { // newest major version first
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi > vj
	})
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	p, err := exec.LookPath("initdb")
	if err != nil {
		return "", fmt.Errorf("no initdb in /usr/lib/postgresql/*/bin or PATH (Debian: apt-get install postgresql, which scripts/testenv.sh does as root)")
	}
	return filepath.Dir(p), nil
}

// StartPostgres starts a cluster for t and stops it, removing its files,
// when t ends. It takes a second or two; start one per test binary
// (SharedPostgres) or per suite and make a database per case with
// NewDatabase. Where the programs are missing (or, as root, the postgres
// user that initdb needs), the test ends as Missing says for Postgres.
func StartPostgres(t testing.TB) *PostgresCluster {
	t.Helper()
	c, err := NewPostgresCluster()
	if err != nil {
		var missing *postgresMissing
		if errors.As(err, &missing) {
			Missing(t, Postgres, err.Error())
		}
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	return c
}

var shared struct {
	mu  sync.Mutex
	c   *PostgresCluster
	err error
}

// SharedPostgres is StartPostgres for a whole test binary: the first call
// starts the cluster, later ones get the same, and StopSharedPostgres
// (call it from TestMain after m.Run) stops it. Give each test a database
// of its own with NewDatabase.
func SharedPostgres(t testing.TB) *PostgresCluster {
	t.Helper()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.c == nil && shared.err == nil {
		shared.c, shared.err = NewPostgresCluster()
	}
	if shared.err != nil {
		var missing *postgresMissing
		if errors.As(shared.err, &missing) {
			Missing(t, Postgres, shared.err.Error())
		}
		t.Fatal(shared.err)
	}
	return shared.c
}

// StopSharedPostgres stops the cluster SharedPostgres started, if any.
func StopSharedPostgres() {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.c != nil {
		shared.c.Stop()
		shared.c = nil
	}
}

// postgresMissing: what the machine lacks to start a cluster.
type postgresMissing struct{ why string }

func (e *postgresMissing) Error() string { return e.why }

// NewPostgresCluster starts a cluster; Stop stops it and removes its
// files. The error is a *postgresMissing (a skip for tests) when the
// machine lacks the programs or the user to run them.
func NewPostgresCluster() (*PostgresCluster, error) {
	bin, err := postgresBin()
	if err != nil {
		return nil, &postgresMissing{err.Error()}
	}
	c := &PostgresCluster{bin: bin}
	// The server refuses to run as root: as root, it runs as the
	// postgres user Debian's package creates.
	owner, base := -1, ""
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, &postgresMissing{"running as root, and there is no postgres user to run the server as: " + err.Error()}
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		// The postgres user must reach the directory: /tmp is
		// traversable by all, where a TMPDIR may be private to root.
		owner, base = uid, "/tmp"
	}
	// Not t.TempDir: its parents are private to this user, and the
	// socket path must stay short (about 100 bytes at most).
	c.dir, err = os.MkdirTemp(base, "pulse-pg-")
	if err != nil {
		return nil, err
	}
	if owner >= 0 {
		if err := os.Chown(c.dir, owner, -1); err != nil {
			os.RemoveAll(c.dir)
			return nil, err
		}
	}
	c.data = filepath.Join(c.dir, "data")
	if out, err := c.run("initdb", "-D", c.data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"); err != nil {
		os.RemoveAll(c.dir)
		return nil, &postgresMissing{fmt.Sprintf("initdb failed: %v\n%s", err, out)}
	}
	opts := fmt.Sprintf("-k %s -c listen_addresses='' -F -c full_page_writes=off -c synchronous_commit=off", c.dir)
	if out, err := c.run("pg_ctl", "start", "-w", "-t", "60", "-D", c.data, "-l", filepath.Join(c.dir, "log"), "-o", opts); err != nil {
		log, _ := os.ReadFile(filepath.Join(c.dir, "log"))
		c.Stop()
		return nil, fmt.Errorf("pg_ctl start: %w\n%s\n%s", err, out, log)
	}
	return c, nil
}

// Stop stops the cluster at once (nothing in it is kept) and removes its
// files.
func (c *PostgresCluster) Stop() {
	if _, err := os.Stat(filepath.Join(c.data, "postmaster.pid")); err == nil {
		if out, err := c.run("pg_ctl", "stop", "-m", "immediate", "-w", "-D", c.data); err != nil {
			fmt.Fprintf(os.Stderr, "testenv: pg_ctl stop: %v\n%s", err, out)
		}
	}
	os.RemoveAll(c.dir)
}

func (c *PostgresCluster) run(prog string, args ...string) ([]byte, error) {
	cmd := exec.Command(filepath.Join(c.bin, prog), args...)
	cmd.Dir = c.dir
	// Only what the programs need: no PG* variable of the caller's
	// steers them to another server.
	cmd.Env = []string{"PATH=" + c.bin + ":/usr/bin:/bin", "LC_ALL=C", "HOME=" + c.dir}
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return out.Bytes(), err
	case <-time.After(2 * time.Minute): // a bound on a hung program, not a speed check
		cmd.Process.Kill()
		<-done
		return out.Bytes(), fmt.Errorf("%s did not finish", prog)
	}
}

// Dir is the directory of the cluster's Unix socket, its data and log.
func (c *PostgresCluster) Dir() string { return c.dir }

// URL returns the postgres:// URL of database name in the cluster, as
// user postgres (any password is accepted).
func (c *PostgresCluster) URL(name string) string {
	return "postgres://postgres@/" + name + "?host=" + c.dir
}

// NewDatabase creates an empty database and returns its URL.
func (c *PostgresCluster) NewDatabase(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("pulse_test_%d", c.n.Add(1))
	if out, err := c.run("createdb", "-h", c.dir, "-U", "postgres", name); err != nil {
		t.Fatalf("createdb %s: %v\n%s", name, err, out)
	}
	return c.URL(name)
}
