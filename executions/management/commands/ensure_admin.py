"""Create the embedded-mode admin login once, and print it every time."""

import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = (
        "Create an admin login for the embedded mode (kept in the data directory) and print it. A user of that "
        "name that exists already is never changed: its own password stays."
    )

    def add_arguments(self, parser):
        parser.add_argument("--username", default="admin")

    def handle(self, *args, **options):
        username = options["username"]
        store = settings.DATA_DIR / "admin-login.txt"
        user = get_user_model().objects.filter(username=username).first()
        password = store.read_text().strip() if store.exists() else ""
        if user is None:
            password = secrets.token_urlsafe(12)
            get_user_model().objects.create_superuser(username=username, email="", password=password)
            settings.DATA_DIR.mkdir(parents=True, exist_ok=True)
            store.write_text(password + "\n")
            store.chmod(0o600)
        elif not password or not user.check_password(password):
            # Someone made or changed this account themselves (createsuperuser, the admin): theirs to keep.
            self.stdout.write(
                f"Admin login: {username} exists with a password of its own (not shown); "
                f"manage.py changepassword {username} sets a new one"
            )
            return
        self.stdout.write(f"Admin login: {username} / {password}")
