"""The gRPC daemon.

One request path (:mod:`.analyze`), the servicers that translate protobuf to and from it
(:mod:`.server`, :mod:`.oip`), and what runs beside it: health, liveness, systemd notify, metrics, listeners,
access control, start-up checks, and :mod:`.app`, which builds the parts in data-path order and serves.
"""
