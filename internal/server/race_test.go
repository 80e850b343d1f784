//go:build race

package server

// raceEnabled makes helper binaries build with -race too, so they reuse
// the packages this test binary already compiled.
const raceEnabled = true
