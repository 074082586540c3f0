// Command luahealth runs an Argo CD resource health script the way Argo CD's application
// controller does, so kubetune's tests can check deploy/argocd/health/finetunejob.lua against the
// real sandbox instead of a Lua with every library loaded.
//
//	luahealth [--open-libs] [--allow-nan] SCRIPT.lua < object.json
//
// What it mirrors (Argo CD v3.5, util/lua/lua.go; re-check when the pinned release changes):
//
//   - gopher-lua (the version in go.mod) with SkipOpenLibs, then exactly the package, base and
//     table libraries and a "safe os" holding only time and date. Argo CD registers that safe os
//     under the table library's name, which is already loaded, so that adds nothing: the global os
//     is nil and only require("os") returns the safe os. No string, math, io, coroutine, debug or
//     channel: strings have no methods either. --open-libs is resource.customizations.useOpenLibs.<group>_<kind>
//     "true": every gopher-lua library is opened first, then the same four are opened again (the
//     global os is then gopher-lua's whole os, while require("os") still gives the safe one:
//     opening the package library again forgets the modules loaded before).
//   - the object: the JSON the API server serves, decoded as Kubernetes decodes an unstructured
//     object (a number is an int64 when it is a whole number that fits, a float64 otherwise), then
//     turned into Lua values as Argo CD does: numbers, strings and booleans as they are, objects as
//     tables, arrays as tables appended in order (gopher-lua's Append drops nils, so a null in an
//     array closes the gap), null as nil. It is the global obj; actionParams is an empty table.
//   - a one-second deadline on the script.
//   - the result: a returned table is read as {status, message}; a status Argo CD does not know
//     becomes Unknown with "Lua returned an invalid health status"; a status or message that is not
//     a string, an empty table, or nil gives an empty status, as Argo CD's JSON round trip does.
//     Any other return value, and any Lua error, is an error.
//
// Output: one JSON object {"status": ..., "message": ...} on stdout, exit 0. A Lua error (or a
// script that cannot be read or compiled, or JSON that cannot be read) goes to stderr, exit 1.
//
// --allow-nan also reads the tokens NaN, Infinity and -Infinity (as Python's json module writes
// them) as float64 numbers. The API server never serves them (they are not JSON), but a float64 NaN
// in an unstructured object reaches a health script as a Lua number, and the script must cope.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"time"

	lua "github.com/yuin/gopher-lua"
)

// The health statuses Argo CD accepts from a script.
var validStatus = map[string]bool{
	"Unknown": true, "Progressing": true, "Suspended": true, "Healthy": true, "Degraded": true, "Missing": true,
}

func main() {
	openLibs := flag.Bool("open-libs", false, "open every gopher-lua library (useOpenLibs: \"true\")")
	allowNaN := flag.Bool("allow-nan", false, "read NaN, Infinity and -Infinity in the object")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: luahealth [--open-libs] [--allow-nan] SCRIPT.lua < object.json")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	script, err := os.ReadFile(flag.Arg(0))
	if err != nil {
		fail(err)
	}
	input, err := io.ReadAll(os.Stdin)
	if err != nil {
		fail(err)
	}
	object, err := decodeObject(input, *allowNaN)
	if err != nil {
		fail(fmt.Errorf("reading the object: %w", err))
	}
	status, message, err := health(string(script), object, *openLibs)
	if err != nil {
		fail(err)
	}
	out, _ := json.Marshal(map[string]string{"status": status, "message": message})
	fmt.Println(string(out))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}

// newSandbox is the Lua state Argo CD gives a health script.
func newSandbox(openLibs bool) *lua.LState {
	l := lua.NewState(lua.Options{SkipOpenLibs: !openLibs})
	safeOs := safeOsFuncs()
	openSafeOs := func(l *lua.LState) int {
		// As Argo CD does: the safe os functions go into the module named like the table library.
		l.Push(l.RegisterModule(lua.TabLibName, safeOs))
		return 1
	}
	libs := []struct {
		name string
		open lua.LGFunction
	}{
		{lua.LoadLibName, lua.OpenPackage},
		{lua.BaseLibName, lua.OpenBase},
		{lua.TabLibName, lua.OpenTable},
		{lua.OsLibName, openSafeOs},
	}
	for _, lib := range libs {
		if err := l.CallByParam(lua.P{Fn: l.NewFunction(lib.open), NRet: 0, Protect: true}, lua.LString(lib.name)); err != nil {
			panic(err)
		}
	}
	l.PreloadModule(lua.OsLibName, func(l *lua.LState) int {
		l.Push(l.SetFuncs(l.NewTable(), safeOs))
		return 1
	})
	return l
}

// safeOsFuncs: gopher-lua's own os.time and os.date (Argo CD's safe os is a copy of those two).
func safeOsFuncs() map[string]lua.LGFunction {
	scratch := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer scratch.Close()
	scratch.Push(scratch.NewFunction(lua.OpenOs))
	scratch.Push(lua.LString(lua.OsLibName))
	scratch.Call(1, 1)
	module := scratch.Get(-1).(*lua.LTable)
	funcs := map[string]lua.LGFunction{}
	for _, name := range []string{"time", "date"} {
		funcs[name] = module.RawGetString(name).(*lua.LFunction).GFunction
	}
	return funcs
}

func health(script string, object any, openLibs bool) (status, message string, err error) {
	l := newSandbox(openLibs)
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	l.SetContext(ctx)
	l.SetGlobal("actionParams", l.NewTable())
	l.SetGlobal("obj", toLua(l, object))

	fn, err := l.LoadString(script)
	if err == nil {
		l.Push(fn)
		err = l.PCall(0, lua.MultRet, nil)
	}
	if err != nil {
		var apiErr *lua.ApiError
		if errors.As(err, &apiErr) && apiErr.Type == lua.ApiErrorRun {
			apiErr.StackTrace = "" // Argo CD shows the message without gopher-lua's stack trace
		}
		return "", "", err
	}
	switch result := l.Get(-1).(type) {
	case *lua.LTable:
		status, message, ok := readResult(result)
		if !ok {
			return "", "", nil
		}
		if !validStatus[status] {
			return "Unknown", "Lua returned an invalid health status", nil
		}
		return status, message, nil
	case *lua.LNilType:
		return "", "", nil
	default:
		return "", "", fmt.Errorf("expect table output from Lua script, not %s", result.Type())
	}
}

// readResult: the returned table's status and message; ok is false where Argo CD's JSON round trip
// gives an empty status (an empty table, or a status or message that is not a string).
func readResult(t *lua.LTable) (status, message string, ok bool) {
	if isEmpty(t) {
		return "", "", false
	}
	for _, key := range []string{"status", "message"} {
		switch v := t.RawGetString(key).(type) {
		case lua.LString:
			if key == "status" {
				status = string(v)
			} else {
				message = string(v)
			}
		case *lua.LNilType:
		default:
			return "", "", false
		}
	}
	return status, message, true
}

func isEmpty(t *lua.LTable) bool {
	key, _ := t.Next(lua.LNil)
	return key == lua.LNil
}

// toLua turns a decoded JSON value into the Lua value Argo CD's script sees.
func toLua(l *lua.LState, value any) lua.LValue {
	switch v := value.(type) {
	case nil:
		return lua.LNil
	case bool:
		return lua.LBool(v)
	case string:
		return lua.LString(v)
	case int64:
		return lua.LNumber(v)
	case float64:
		return lua.LNumber(v)
	case []any:
		t := l.CreateTable(len(v), 0)
		for _, item := range v {
			t.Append(toLua(l, item))
		}
		return t
	case map[string]any:
		t := l.CreateTable(0, len(v))
		for key, item := range v {
			t.RawSetH(lua.LString(key), toLua(l, item))
		}
		return t
	}
	panic(fmt.Sprintf("unexpected decoded value %T", value))
}

// Markers for the non-JSON number tokens (--allow-nan): strings no object carries.
const nonFinite = "\x00luahealth:"

var nonFiniteTokens = []struct {
	token string
	value float64
}{
	{"-Infinity", math.Inf(-1)},
	{"Infinity", math.Inf(1)},
	{"NaN", math.NaN()},
}

// decodeObject reads JSON as Kubernetes reads an unstructured object: numbers become int64 when
// they are whole numbers in int64's range, float64 otherwise.
func decodeObject(input []byte, allowNaN bool) (any, error) {
	if allowNaN {
		input = markNonFinite(input)
	}
	decoder := json.NewDecoder(bytes.NewReader(input))
	decoder.UseNumber()
	var raw any
	if err := decoder.Decode(&raw); err != nil {
		return nil, err
	}
	if decoder.More() {
		return nil, errors.New("more than one JSON value")
	}
	return convert(raw)
}

func convert(value any) (any, error) {
	switch v := value.(type) {
	case json.Number:
		if i, err := strconv.ParseInt(string(v), 10, 64); err == nil {
			return i, nil
		}
		f, err := strconv.ParseFloat(string(v), 64)
		if err != nil {
			return nil, fmt.Errorf("number %s: %w", v, err)
		}
		return f, nil
	case string:
		for _, nf := range nonFiniteTokens {
			if v == nonFinite+nf.token {
				return nf.value, nil
			}
		}
		return v, nil
	case []any:
		for i, item := range v {
			c, err := convert(item)
			if err != nil {
				return nil, err
			}
			v[i] = c
		}
		return v, nil
	case map[string]any:
		for key, item := range v {
			c, err := convert(item)
			if err != nil {
				return nil, err
			}
			v[key] = c
		}
		return v, nil
	}
	return value, nil
}

// markNonFinite replaces the tokens NaN, Infinity and -Infinity outside strings by marker strings.
func markNonFinite(input []byte) []byte {
	var out bytes.Buffer
	inString, escaped := false, false
	for i := 0; i < len(input); i++ {
		c := input[i]
		if inString {
			out.WriteByte(c)
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
			continue
		}
		if c == '"' {
			inString = true
			out.WriteByte(c)
			continue
		}
		replaced := false
		for _, nf := range nonFiniteTokens {
			if bytes.HasPrefix(input[i:], []byte(nf.token)) {
				marker, _ := json.Marshal(nonFinite + nf.token)
				out.Write(marker)
				i += len(nf.token) - 1
				replaced = true
				break
			}
		}
		if !replaced {
			out.WriteByte(c)
		}
	}
	return out.Bytes()
}
