from django.urls import path

from sso import views

app_name = "sso"

urlpatterns = [
    path("start/", views.SignIn.as_view(), name="start"),
    path("callback/", views.Callback.as_view(), name="callback"),
    path("failed/", views.failed, name="failed"),
]
