from django.urls import path

from shop import views

urlpatterns = [
    path("orders/", views.place_order),
    path("orders/async/", views.place_order_async),
    path("orders/<int:order_id>/", views.order_status),
]
