from django.db import models


class Product(models.Model):
    sku = models.CharField(primary_key=True, max_length=40)
    stock = models.IntegerField()


class Order(models.Model):
    sku = models.CharField(max_length=40)
    quantity = models.IntegerField()
    status = models.CharField(max_length=20, default="placed")
    tracking = models.CharField(max_length=60, blank=True)


class Effect(models.Model):
    """A log of what the workflow's steps did, one row per effect applied (to check: each one once)."""

    order = models.ForeignKey(Order, on_delete=models.CASCADE)
    kind = models.CharField(max_length=20)
    pid = models.IntegerField()
