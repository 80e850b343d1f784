module github.com/pulse-agent/pulse

go 1.26
