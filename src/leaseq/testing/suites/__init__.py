"""The conformance suite's test classes, one module per area of the store protocol."""
