"""Create the embedded-mode admin login once, and print it every time."""

import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create an admin login for the embedded mode (kept in the data directory) and print it."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="admin")

    def handle(self, *args, **options):
        username = options["username"]
        store = settings.DATA_DIR / "admin-login.txt"
        User = get_user_model()
        user = User.objects.filter(username=username).first()
        password = store.read_text().strip() if store.exists() else ""
        if user is None or not password or not user.check_password(password):
            password = secrets.token_urlsafe(12)
            if user is None:
                user = User.objects.create_superuser(username=username, email="", password=password)
            else:
                user.set_password(password)
                user.is_staff = user.is_superuser = user.is_active = True
                user.save()
            settings.DATA_DIR.mkdir(parents=True, exist_ok=True)
            store.write_text(password + "\n")
            store.chmod(0o600)
        self.stdout.write(f"Admin login: {username} / {password}")
