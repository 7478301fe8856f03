"""How messages and sockets travel, beneath every app: the channel layer (Tether's own pub/sub client on Redis,
with size caps and error counts) and the patches to the servers it runs on (daphne's close reasons, Twisted's
writes, the WebSocket origin check). Imports nothing of Tether's apps."""
