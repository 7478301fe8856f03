from django.urls import path

from recordings import views

app_name = "recordings"

urlpatterns = [
    path("terminals/<uuid:session_id>/shares/", views.session_shares, name="session_shares"),
    path("machines/<slug:name>/recordings/", views.machine_recordings, name="machine_recordings"),
    path("recordings/<int:pk>/", views.recording_player, name="recording"),
    path("recordings/<int:pk>/cast", views.recording_cast, name="recording_cast"),
    path("shares/<int:pk>/revoke/", views.revoke_share, name="revoke_share"),
    path("shares/<str:token>/", views.share, name="share"),
    path("shares/<str:token>/cast", views.share_cast, name="share_cast"),
]
