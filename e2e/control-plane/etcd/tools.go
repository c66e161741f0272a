//go:build tools

// Package tools pins etcd's server (a main package) so that `go mod tidy`
// records what it needs in go.sum. build.sh builds it from this module.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
)
