from django.urls import path
from shopfront import views

urlpatterns = [
    path("orders", views.place_order),
    path("orders/<int:order_id>", views.order_detail),
]
