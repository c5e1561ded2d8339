"""Typed events shared by producers and consumers in the tests (each side decorates them with its app)."""

import uuid
from dataclasses import dataclass

from pydantic import BaseModel


@dataclass
class UserRegistered:
    user_id: int
    email: str


class UserRegisteredModel(BaseModel):
    user_id: uuid.UUID
    email: str
