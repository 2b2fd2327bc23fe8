"""Generated gRPC stubs and their .proto sources (regenerate with ``make proto``)."""
