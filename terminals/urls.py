from django.urls import path

from terminals import recording_views, views

app_name = "terminals"

urlpatterns = [
    path("", views.workspaces, name="workspaces"),
    path("machines/<slug:name>/open/", views.open_machine, name="open"),
    path("machines/<slug:name>/history/", views.history, name="history"),
    path("terminals/<uuid:session_id>/", views.terminal, name="terminal"),
    path("terminals/<uuid:session_id>/commands/", views.commands, name="commands"),
    path("terminals/<uuid:session_id>/shares/", recording_views.session_shares, name="session_shares"),
    path("machines/<slug:name>/recordings/", recording_views.machine_recordings, name="machine_recordings"),
    path("recordings/<int:pk>/", recording_views.recording_player, name="recording"),
    path("recordings/<int:pk>/cast", recording_views.recording_cast, name="recording_cast"),
    path("shares/<int:pk>/revoke/", recording_views.revoke_share, name="revoke_share"),
    path("shares/<str:token>/", recording_views.share, name="share"),
    path("shares/<str:token>/cast", recording_views.share_cast, name="share_cast"),
    path("preferences/", views.preferences, name="preferences"),
]
