// Command front is a thin pulse front end for Linux (main_linux.go says
// why it exists); elsewhere it is empty.
package main
