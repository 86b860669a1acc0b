/*
 * args.c
 *		Argument checks shared by the SQL entry points: bad input is an error
 *		raised before anything is locked or written.
 */
#include "postgres.h"

#include "base.h"

void
RpNoNull(bool isnull, const char *what)
{
	if (isnull)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be NULL", what)));
}

/*
 * The argument an error names: name, or name[elem] for element elem
 * (1-based) of an array; built only for the error.
 */
static char *
ArgName(const char *name, int elem)
{
	return elem == 0 ? pstrdup(name) : psprintf("%s[%d]", name, elem);
}

void
RpCheckUserId(text *user_id, const char *name, int elem)
{
	int			len = VARSIZE_ANY_EXHDR(user_id);

	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be empty", ArgName(name, elem))));
	if (len > RP_MAX_USER_ID_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s is too long", ArgName(name, elem)),
				 errdetail("An id has at most %d bytes; this one has %d.",
						   RP_MAX_USER_ID_BYTES, len)));
}

void
RpCheckRequestId(text *request_id, const char *name, int elem)
{
	int			len = request_id ? VARSIZE_ANY_EXHDR(request_id) : 0;

	if (len > RP_MAX_USER_ID_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s is too long", ArgName(name, elem)),
				 errdetail("A request_id has at most %d bytes; this one has %d.",
						   RP_MAX_USER_ID_BYTES, len)));
}

/* A batch's memory and time grow with its size: refuse more than the limit. */
void
RpCheckBatchSize(int n)
{
	if (n > RP_MAX_BATCH)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("a batch of %d claims is too large", n),
				 errdetail("rp_claim_batch takes at most %d claims per call.", RP_MAX_BATCH),
				 errhint("Split the claims into calls of at most %d elements.", RP_MAX_BATCH)));
}
