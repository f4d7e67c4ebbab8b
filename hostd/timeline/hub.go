package timeline

import "sync"

// Hub lets event streams sleep until a run's timeline changes. A stream
// takes Changed's channel before it reads the database and waits on it
// after, so an entry appended in between is never missed.
type Hub struct {
	mu      sync.Mutex
	waiters map[string]chan struct{}
}

// NewHub returns an empty hub.
func NewHub() *Hub { return &Hub{waiters: map[string]chan struct{}{}} }

// Changed returns a channel that is closed at the next Notify for runID.
func (h *Hub) Changed(runID string) <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	ch, ok := h.waiters[runID]
	if !ok {
		ch = make(chan struct{})
		h.waiters[runID] = ch
	}
	return ch
}

// Notify wakes everyone waiting on runID.
func (h *Hub) Notify(runID string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if ch, ok := h.waiters[runID]; ok {
		close(ch)
		delete(h.waiters, runID)
	}
}

// NotifyAll wakes every waiter: after changes may have gone unannounced
// (a lost connection to the database that announces them), each looks
// again.
func (h *Hub) NotifyAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for id, ch := range h.waiters {
		close(ch)
		delete(h.waiters, id)
	}
}
