"""HTTP and WebSocket handlers: parse, validate, authenticate, call a service, answer JSON.
They know nothing of kernels or sandboxes."""
