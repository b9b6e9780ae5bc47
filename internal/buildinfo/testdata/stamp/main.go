// Command stamp prints buildinfo.Get(): TestStampedByLinker builds it with
// -ldflags -X.
package main

import (
	"fmt"

	"github.com/storaged/storaged/internal/buildinfo"
)

func main() { fmt.Print(buildinfo.Get()) }
