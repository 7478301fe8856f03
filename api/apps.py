from django.apps import AppConfig


class ApiConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "api"
    verbose_name = "API"

    def ready(self) -> None:
        from api.models import ApiInput, InputState
        from terminals.signals import api_input_taken

        def take(sender, claim: int, **kwargs) -> bool:
            """The owner takes a numbered input to write it; refused once its sender gave it up."""
            return ApiInput.objects.filter(pk=claim, state=InputState.SENDING).update(state=InputState.TAKEN) == 1

        api_input_taken.connect(take, weak=False, dispatch_uid="api.take_input")
