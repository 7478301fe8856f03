from django.contrib import admin
from django.urls import include, path

from api.urls import pages as api_pages
from terminals import health

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", health.metrics, name="metrics"),
    path("admin/", admin.site.urls),
    path("api/", include("api.urls")),
    *api_pages,
    path("accounts/", include("django.contrib.auth.urls")),
    path("sso/", include("sso.urls")),
    path("", include("terminals.urls")),
    path("", include("recordings.urls")),
]
