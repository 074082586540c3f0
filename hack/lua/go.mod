module kubetune.local/luahealth

go 1.23

// The gopher-lua release Argo CD v3.5.1 builds with (its go.mod). hack/build-lua.sh reads the
// version from here.
require github.com/yuin/gopher-lua v1.1.2
