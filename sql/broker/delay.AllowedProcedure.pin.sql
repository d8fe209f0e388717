/*
One-off pinning of allow-list entries listed before DefinitionHash existed:
each is pinned to the definition its procedure has at upgrade time (the
upgrade is their listing moment).  Entries listed by delay.AllowProcedure are
pinned already, so on a fresh install and on any later run this changes
nothing.  An entry whose procedure is encrypted (no readable definition) stays
NULL and resolves to 50340 until it is replaced by a readable one and listed.
*/
UPDATE delay.AllowedProcedure
SET DefinitionHash = HASHBYTES('SHA2_256', OBJECT_DEFINITION(ObjectId))
WHERE DefinitionHash IS NULL;
