from django.apps import AppConfig


class ShopfrontConfig(AppConfig):
    name = "shopfront"
