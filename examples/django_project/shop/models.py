from django.db import models


class Order(models.Model):
    email = models.EmailField()
    confirmed = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
