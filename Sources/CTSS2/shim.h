/* The TPM2 Software Stack (Debian's libtss2-dev): ESAPI, the TCTI loader (device, tabrmd and
 * swtpm TCTIs are chosen by a configuration string), marshalling and response-code texts. */
#include <tss2/tss2_esys.h>
#include <tss2/tss2_tctildr.h>
#include <tss2/tss2_mu.h>
#include <tss2/tss2_rc.h>
