package initprog

import "github.com/pulse-agent/pulse/backend/namespace/internal/nsinit"

func initSandbox() { nsinit.Init() }
