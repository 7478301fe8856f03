"""WebSocket routes. The terminal consumer arrives with the owner worker."""

websocket_urlpatterns: list = []
