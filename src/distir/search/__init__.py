"""Strategy search: space, analytic screen, layer assignment, placement, exact re-rank, store."""
