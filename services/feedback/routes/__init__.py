"""Routes of the feedback API, one module per resource."""
