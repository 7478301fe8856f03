from django.urls import path

from api import views
from api.api import api

urlpatterns = [path("v1/", api.urls)]

# The portal's Tokens page (not under /api/: a page for people, with a login and CSRF).
pages = [
    path("tokens/", views.tokens, name="api_tokens"),
    path("tokens/<int:pk>/revoke/", views.revoke, name="api_token_revoke"),
]
