package api

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/ephemeralhq/ephemeral/hostd/runs"
	"github.com/ephemeralhq/ephemeral/hostd/store"
)

// checkGrants makes sure a run asks only for connections its organisation
// has, with no method the organisation does not allow. Another
// organisation's connection of the same name is simply unknown.
func (s *Server) checkGrants(ctx context.Context, orgID string, grants []runs.Connection) (*apiError, error) {
	for i, g := range grants {
		p := fmt.Sprintf("connections[%d]", i)
		c, err := s.store.Connection(ctx, orgID, g.Name)
		if errors.Is(err, store.ErrNotFound) {
			return badParam(p+".name", "connection_not_found",
				fmt.Sprintf("the organisation has no connection %q (ephemeral admin connection add)", g.Name)), nil
		}
		if err != nil {
			return nil, err
		}
		for j, m := range g.Methods {
			if !slices.Contains(c.Methods, m) {
				return badParam(fmt.Sprintf("%s.methods[%d]", p, j), "method_not_allowed",
					fmt.Sprintf("connection %q allows only %v", g.Name, c.Methods)), nil
			}
		}
	}
	return nil, nil
}
