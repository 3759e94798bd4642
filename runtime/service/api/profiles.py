"""The pinned profile of one of the calling app's users: name, pronouns, facts.

The profile is rendered first in the ``memory`` source of every context of the user
(``runtime.context``). ``PUT`` sets what it names (``null`` leaves a field, ``""`` clears
name or pronouns, ``facts`` replaces the user-set facts); facts learned from summaries
are shown but changed only by compaction (:class:`memory.profiles.Profiles`).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends

from memory.tables import App
from runtime.service.api.convert import profile_out
from runtime.service.api.deps import Services, current_app, services
from runtime.service.api.schemas import ErrorBody, ProfileIn, ProfileOut

router = APIRouter(
    prefix="/v1",
    tags=["users"],
    responses={
        401: {"model": ErrorBody, "description": "No or invalid API key (`unauthorized`)."},
        404: {"model": ErrorBody, "description": "No such user for this app (`not_found`)."},
    },
)


@router.get("/users/{user_id}/profile", response_model=ProfileOut)
def get_profile(user_id: str, app: App = Depends(current_app), svc: Services = Depends(services)):
    """The user's pinned profile (empty fields when nothing was set or learned)."""
    user = svc.directory.user(app.id, user_id)
    return profile_out(svc.engine.profiles.get(user.id), user, svc.engine.profiles.learned(user.id))


@router.put("/users/{user_id}/profile", response_model=ProfileOut)
def put_profile(user_id: str, body: ProfileIn, app: App = Depends(current_app), svc: Services = Depends(services)):
    """Set the user's pinned profile; answers the whole profile as stored."""
    user = svc.directory.user(app.id, user_id)
    profile = svc.engine.set_profile(
        user_id=user.id, name=body.name, pronouns=body.pronouns, facts=body.facts, time_zone=body.time_zone
    )
    return profile_out(profile, user, svc.engine.profiles.learned(user.id))
