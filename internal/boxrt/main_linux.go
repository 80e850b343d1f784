package boxrt

import (
	"errors"
	"fmt"
	"os"
)

// Exit statuses of Main besides 0 and 1.
const (
	// ExitUsage: the step or its arguments are not known.
	ExitUsage = 2
	// ExitLinks: capture found a regular file of more than one link;
	// the caller breaks the links and captures again.
	ExitLinks = 3
)

// Main runs one step of the runtime, named by args[0], and returns its
// exit status:
//
//	exec ID DIR FSIZE NONCE CMD...  run one command (exec_linux.go)
//	cmd FSIZE UMASK ENV CMD...      the command's own process (runCmd)
//	unlink                          break hard links (runUnlink)
//	sync ID                         bring base up to date (runSync)
//	loop                            a pooled exec's requests (runLoop)
//	idle IDLE POLL [CHAN UID GID]   a warm container's main process (runIdle)
//	tty DIR UID GID ... CMD...      a terminal command's exec (runTTY)
//	ttycmd FSIZE PGID TIME ENV CMD  its process as the uid (runTTYCmd)
//	kill ID                         kill a command's processes (runKill)
//	signal ID SIG                   signal a command (runSignal)
//	identity                        print Identity
//	capture R Q O BEFORE            what a command changed (capture)
//	fullman DIR MANIFEST            the manifest of all of DIR (fullman)
//	mfupdate MANIFEST GONE NEW [D]  a manifest after a step (mfupdate)
//	mdiff BASEMAN COPYMAN DROP FIX  a copy's repair lists (mdiff)
//	manlines DIR                    manifest lines of DIR, to stdout
//	gvserve                         a warm gVisor sandbox's init (gvisor_linux.go)
//	gvcmd                           one command's namespaces there (runGVCmd)
func Main(args []string) int {
	if len(args) == 0 {
		return usage()
	}
	var err error
	switch a := args[1:]; {
	case args[0] == "exec":
		return runExec(a)
	case args[0] == "tty":
		return runTTY(a)
	case args[0] == "ttycmd":
		return runTTYCmd(a)
	case args[0] == "loop":
		return runLoop(a)
	case args[0] == "idle":
		return runIdle(a)
	case args[0] == "gvserve":
		return runGVServe(a)
	case args[0] == "gvcmd":
		return runGVCmd(a)
	case args[0] == "kill":
		return runKill(a)
	case args[0] == "signal":
		return runSignal(a)
	case args[0] == "sync":
		return runSync(a)
	case args[0] == "cmd":
		return runCmd(a)
	case args[0] == "unlink" && len(a) == 0:
		return runUnlink()
	case args[0] == "identity" && len(a) == 0:
		_, err = fmt.Println(Identity())
	case args[0] == "capture" && len(a) == 4:
		err = capture(a[0], a[1], a[2], a[3])
		if errors.Is(err, errLinks) {
			return ExitLinks
		}
	case args[0] == "fullman" && len(a) == 2:
		err = fullman(a[0], a[1])
	case args[0] == "mfupdate" && (len(a) == 3 || len(a) == 4):
		d := ""
		if len(a) == 4 {
			d = a[3]
		}
		err = mfupdate(a[0], a[1], a[2], d)
	case args[0] == "mdiff" && len(a) == 4:
		err = mdiff(a[0], a[1], a[2], a[3])
	case args[0] == "manlines" && len(a) == 1:
		err = manlines(a[0], os.Stdout)
	default:
		return usage()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s %s: %v\n", Name, args[0], err)
		return 1
	}
	return 0
}

func usage() int {
	fmt.Fprintln(os.Stderr, Name+": the in-box runtime of the pulse backends; the backend runs it, not a person")
	return ExitUsage
}
