"""gRPC servicers: translate CRI messages to domain calls and back, nothing more."""
