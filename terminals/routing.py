from django.urls import path

from terminals.consumers import TerminalConsumer

websocket_urlpatterns = [
    path("ws/terminals/<uuid:session>/", TerminalConsumer.as_asgi()),
]
