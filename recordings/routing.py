from django.urls import path

from recordings.consumers import SharedTerminalConsumer

websocket_urlpatterns = [
    path("ws/shares/<str:token>/", SharedTerminalConsumer.as_asgi()),
]
