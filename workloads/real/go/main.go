// Command golua runs a Lua 5.1 benchmark script (bench.lua, embedded) on
// gopher-lua, a Lua VM written in Go. The VM is github.com/yuin/gopher-lua,
// unmodified; this driver is ours. Usage: golua N (N >= 1 scales the work).
package main

import (
	_ "embed"
	"fmt"
	"os"
	"strconv"

	lua "github.com/yuin/gopher-lua"
)

//go:embed bench.lua
var script string

func main() {
	n := 1
	if len(os.Args) > 1 {
		v, err := strconv.Atoi(os.Args[1])
		if err != nil || v < 1 {
			fmt.Fprintln(os.Stderr, "usage: golua N   (N >= 1 scales the work)")
			os.Exit(2)
		}
		n = v
	}
	L := lua.NewState()
	defer L.Close()
	L.SetGlobal("N", lua.LNumber(n))
	if err := L.DoString(script); err != nil {
		fmt.Fprintln(os.Stderr, "golua: script failed:", err)
		os.Exit(1)
	}
}
