package chapi

import (
	"encoding/json"
	"fmt"
)

// parseInfo decodes a vm.info answer, rejecting states outside the API's
// enum so that callers comparing against StateRunning never act on a value
// they do not understand.
func parseInfo(body []byte) (VMInfo, error) {
	var info VMInfo
	if err := json.Unmarshal(body, &info); err != nil {
		return VMInfo{}, fmt.Errorf("decode: %w", err)
	}
	if !info.State.known() {
		return VMInfo{}, fmt.Errorf("unknown VM state %q", truncate(string(info.State), 64))
	}
	return info, nil
}
