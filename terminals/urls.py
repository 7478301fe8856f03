from django.urls import path

from terminals import views

app_name = "terminals"

urlpatterns = [
    path("", views.workspaces, name="workspaces"),
    path("machines/<slug:name>/open/", views.open_machine, name="open"),
    path("machines/<slug:name>/history/", views.history, name="history"),
    path("terminals/<uuid:session_id>/", views.terminal, name="terminal"),
    path("terminals/<uuid:session_id>/commands/", views.commands, name="commands"),
    path("preferences/", views.preferences, name="preferences"),
]
